//! Host memory the device reads: `HostRegistration` (a registered, optionally mapped slice, e.g. the
//! model file's mapping) and `PinnedBuffer` (page-locked staging for asynchronous copies).

use super::super::ffi;
use std::alloc::Layout;
use std::ffi::c_void;

use super::context::HipContext;
use super::memory::DevicePtr;
use super::{HipError, HipResult, check};

/// Host memory registered with the runtime (page-locked; optionally mapped into the device's address
/// space), unregistered on drop. Borrowing the slice keeps the memory alive for the registration.
pub struct HostRegistration<'a> {
    pub(super) ctx: HipContext,
    pub(super) ptr: *mut c_void,
    pub(super) len: usize,
    pub(super) mapped: bool,
    pub(super) _borrow: std::marker::PhantomData<&'a mut [u8]>,
}

// SAFETY: a registration is an address range known to the runtime; it may be used and dropped on
// any thread (the borrow, for the safe constructor, keeps the memory itself in place).
unsafe impl Send for HostRegistration<'_> {}
unsafe impl Sync for HostRegistration<'_> {}

impl<'a> HostRegistration<'a> {
    /// Register `memory`; with `mapped` the device can read it through `device_ptr` (zero-copy).
    pub fn new(ctx: &HipContext, memory: &'a mut [u8], mapped: bool) -> HipResult<HostRegistration<'a>> {
        // SAFETY: the borrow keeps the memory alive and unaliased while registered.
        unsafe { Self::from_raw(ctx, memory.as_mut_ptr().cast(), memory.len(), mapped, false) }
    }

    /// Register a raw host range (e.g. a read-only file mapping; `read_only` then tells the runtime
    /// the device only reads it).
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay mapped for the lifetime `'a` and must not be unmapped while registered.
    pub unsafe fn from_raw(
        ctx: &HipContext,
        ptr: *mut c_void,
        len: usize,
        mapped: bool,
        read_only: bool,
    ) -> HipResult<HostRegistration<'a>> {
        let mut flags = ffi::HOST_REGISTER_PORTABLE;
        if mapped {
            flags |= ffi::HOST_REGISTER_MAPPED;
        }
        if read_only {
            flags |= ffi::HOST_REGISTER_READ_ONLY;
        }
        check("hipHostRegister", unsafe {
            (ctx.api().hipHostRegister)(ptr, len, flags)
        })?;
        Ok(HostRegistration {
            ctx: ctx.clone(),
            ptr,
            len,
            mapped,
            _borrow: std::marker::PhantomData,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of the registered memory (mapped registrations only).
    pub fn device_ptr(&self) -> HipResult<DevicePtr> {
        if !self.mapped {
            return Err(HipError {
                call: "hipHostGetDevicePointer",
                code: 1,
            });
        }
        let mut dev: *mut c_void = std::ptr::null_mut();
        // SAFETY: registered host pointer, valid out-pointer.
        check("hipHostGetDevicePointer", unsafe {
            (self.ctx.api().hipHostGetDevicePointer)(&mut dev, self.ptr, 0)
        })?;
        Ok(DevicePtr(dev as usize as u64))
    }
}

impl Drop for HostRegistration<'_> {
    fn drop(&mut self) {
        // SAFETY: registered pointer unregistered once.
        let _ = unsafe { (self.ctx.api().hipHostUnregister)(self.ptr) };
    }
}

const PAGE: usize = 4096;

/// A page-aligned host buffer registered with the runtime: the staging area for asynchronous uploads
/// (registration of our own allocation rather than hipHostMalloc, which is deprecated).
pub struct PinnedBuffer {
    pub(super) ctx: HipContext,
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
    pub(super) layout: Layout,
}

// SAFETY: owned allocation; access goes through &/&mut self.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    pub fn new(ctx: &HipContext, len: usize) -> HipResult<PinnedBuffer> {
        let size = len.max(1).next_multiple_of(PAGE);
        let layout = Layout::from_size_align(size, PAGE).map_err(|_| HipError {
            call: "hipHostRegister",
            code: 2,
        })?;
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(HipError {
                call: "hipHostRegister",
                code: 2, // hipErrorOutOfMemory (host)
            });
        }
        // SAFETY: fresh allocation of `size` bytes.
        let code = unsafe { (ctx.api().hipHostRegister)(ptr.cast(), size, ffi::HOST_REGISTER_PORTABLE) };
        if code != ffi::HIP_SUCCESS {
            // SAFETY: allocated above with this layout.
            unsafe { std::alloc::dealloc(ptr, layout) };
            return Err(HipError {
                call: "hipHostRegister",
                code,
            });
        }
        Ok(PinnedBuffer {
            ctx: ctx.clone(),
            ptr,
            len,
            layout,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: live allocation of at least len initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: registered in `new`; unregister before freeing.
        unsafe {
            let _ = (self.ctx.api().hipHostUnregister)(self.ptr.cast());
            std::alloc::dealloc(self.ptr, self.layout);
        }
    }
}
