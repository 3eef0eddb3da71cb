//! Device memory: `DeviceBuffer` (owned, freed on drop) and its copies to and from the host, the
//! device, pinned staging buffers and fills; `DevicePtr` and the `DeviceCopy` plain-data bound.

use super::super::ffi;
use std::ffi::{c_int, c_void};

use super::super::kernels::Arg;
use super::context::HipContext;
use super::host::PinnedBuffer;
use super::stream::Stream;
use super::{HipError, HipResult, check};

/// Plain data that may be copied bytewise between host and device.
///
/// # Safety
/// Implementors must have no padding, no pointers to host memory and be valid for any bit pattern.
pub unsafe trait DeviceCopy: Copy + 'static {}
// SAFETY: primitive numbers satisfy the contract.
unsafe impl DeviceCopy for u8 {}
unsafe impl DeviceCopy for i8 {}
unsafe impl DeviceCopy for u16 {}
unsafe impl DeviceCopy for i16 {}
unsafe impl DeviceCopy for u32 {}
unsafe impl DeviceCopy for i32 {}
unsafe impl DeviceCopy for u64 {}
unsafe impl DeviceCopy for i64 {}
unsafe impl DeviceCopy for f32 {}
unsafe impl DeviceCopy for f64 {}
unsafe impl DeviceCopy for DevicePtr {}

/// A device address, as passed to kernels (8 bytes, by value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The address `bytes` further on.
    pub fn offset(self, bytes: usize) -> DevicePtr {
        DevicePtr(self.0 + bytes as u64)
    }

    pub(super) fn as_mut_ptr(self) -> *mut c_void {
        self.0 as usize as *mut c_void
    }
}

/// A device pointer passed to a kernel: its address.
impl From<DevicePtr> for Arg {
    fn from(p: DevicePtr) -> Arg {
        Arg::Ptr(p.0)
    }
}

pub(super) fn range_check(call: &'static str, offset: usize, len: usize, size: usize) -> HipResult<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(HipError { call, code: 1 }), // hipErrorInvalidValue: refused before reaching the runtime
    }
}

/// Device memory owned by this value; freed on drop.
pub struct DeviceBuffer {
    pub(super) ctx: HipContext,
    pub(super) ptr: *mut c_void,
    pub(super) bytes: usize,
}

// SAFETY: a device address is usable from any thread of the process.
unsafe impl Send for DeviceBuffer {}
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    pub fn ptr(&self) -> DevicePtr {
        DevicePtr(self.ptr as usize as u64)
    }

    pub fn len_bytes(&self) -> usize {
        self.bytes
    }

    /// Copy `src` to byte `offset` of this buffer and wait for it.
    pub fn copy_from_host<T: DeviceCopy>(&mut self, offset: usize, src: &[T]) -> HipResult<()> {
        let n = std::mem::size_of_val(src);
        range_check("hipMemcpy", offset, n, self.bytes)?;
        // SAFETY: in-bounds device range; host slice valid for n bytes.
        check("hipMemcpy", unsafe {
            (self.ctx.api().hipMemcpy)(
                self.ptr().offset(offset).as_mut_ptr(),
                src.as_ptr().cast(),
                n,
                ffi::MEMCPY_HOST_TO_DEVICE,
            )
        })
    }

    /// Copy from byte `offset` of this buffer into `dst` and wait for it.
    pub fn copy_to_host<T: DeviceCopy>(&self, offset: usize, dst: &mut [T]) -> HipResult<()> {
        let n = std::mem::size_of_val(dst);
        range_check("hipMemcpy", offset, n, self.bytes)?;
        // SAFETY: in-bounds device range; host slice valid for n bytes.
        check("hipMemcpy", unsafe {
            (self.ctx.api().hipMemcpy)(
                dst.as_mut_ptr().cast(),
                self.ptr().offset(offset).as_mut_ptr(),
                n,
                ffi::MEMCPY_DEVICE_TO_HOST,
            )
        })
    }

    /// Read the whole buffer as `T`s (synchronous).
    pub fn to_vec<T: DeviceCopy + Default>(&self) -> HipResult<Vec<T>> {
        let mut v = vec![T::default(); self.bytes / std::mem::size_of::<T>()];
        self.copy_to_host(0, &mut v)?;
        Ok(v)
    }

    /// Enqueue a device → device copy of `bytes` from `src[src_offset..]` to `self[offset..]`.
    pub fn copy_from_device_async(
        &mut self,
        offset: usize,
        src: &DeviceBuffer,
        src_offset: usize,
        bytes: usize,
        stream: &Stream,
    ) -> HipResult<()> {
        range_check("hipMemcpyAsync", offset, bytes, self.bytes)?;
        range_check("hipMemcpyAsync", src_offset, bytes, src.bytes)?;
        // SAFETY: both ranges are in bounds of live device allocations.
        check("hipMemcpyAsync", unsafe {
            (self.ctx.api().hipMemcpyAsync)(
                self.ptr().offset(offset).as_mut_ptr(),
                src.ptr().offset(src_offset).as_mut_ptr(),
                bytes,
                ffi::MEMCPY_DEVICE_TO_DEVICE,
                stream.raw,
            )
        })
    }

    /// Enqueue a copy from a pinned host buffer (truly asynchronous; the pinned buffer must not be
    /// rewritten before the stream passes this copy, which the borrow cannot enforce across calls).
    pub fn copy_from_pinned_async(
        &mut self,
        offset: usize,
        src: &PinnedBuffer,
        bytes: usize,
        stream: &Stream,
    ) -> HipResult<()> {
        range_check("hipMemcpyAsync", offset, bytes, self.bytes)?;
        range_check("hipMemcpyAsync", 0, bytes, src.len)?;
        // SAFETY: the first `bytes` of a live pinned allocation are page-locked host memory; that they
        // stay unchanged until the stream passes the copy is this method's documented condition.
        unsafe { self.copy_from_locked_host_async(offset, src.ptr, bytes, stream) }
    }

    /// Enqueue a copy of `bytes` from the host address `src` (a pinned buffer or a registered range).
    ///
    /// # Safety
    /// `src..src+bytes` must be page-locked host memory that stays mapped and unchanged until the
    /// stream passes this copy.
    pub unsafe fn copy_from_locked_host_async(
        &mut self,
        offset: usize,
        src: *const u8,
        bytes: usize,
        stream: &Stream,
    ) -> HipResult<()> {
        range_check("hipMemcpyAsync", offset, bytes, self.bytes)?;
        // SAFETY: in-bounds device range; the host range is the caller's promise.
        check("hipMemcpyAsync", unsafe {
            (self.ctx.api().hipMemcpyAsync)(
                self.ptr().offset(offset).as_mut_ptr(),
                src as *mut c_void,
                bytes,
                ffi::MEMCPY_HOST_TO_DEVICE,
                stream.raw,
            )
        })
    }

    /// Enqueue a copy into a pinned host buffer.
    pub fn copy_to_pinned_async(
        &self,
        offset: usize,
        dst: &mut PinnedBuffer,
        bytes: usize,
        stream: &Stream,
    ) -> HipResult<()> {
        range_check("hipMemcpyAsync", offset, bytes, self.bytes)?;
        range_check("hipMemcpyAsync", 0, bytes, dst.len)?;
        // SAFETY: in-bounds ranges of live allocations.
        check("hipMemcpyAsync", unsafe {
            (self.ctx.api().hipMemcpyAsync)(
                dst.ptr.cast(),
                self.ptr().offset(offset).as_mut_ptr(),
                bytes,
                ffi::MEMCPY_DEVICE_TO_HOST,
                stream.raw,
            )
        })
    }

    /// Enqueue filling `bytes` bytes from `offset` with `value`.
    pub fn fill_bytes_async(&mut self, offset: usize, bytes: usize, value: u8, stream: &Stream) -> HipResult<()> {
        range_check("hipMemsetAsync", offset, bytes, self.bytes)?;
        // SAFETY: in-bounds device range.
        check("hipMemsetAsync", unsafe {
            (self.ctx.api().hipMemsetAsync)(
                self.ptr().offset(offset).as_mut_ptr(),
                value as c_int,
                bytes,
                stream.raw,
            )
        })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // hipFree waits for work using the buffer. A failure here (device lost) has nowhere to go.
        // SAFETY: pointer from hipMalloc, freed once.
        let _ = unsafe { (self.ctx.api().hipFree)(self.ptr) };
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_checks_refuse_out_of_bounds_copies() {
        assert!(range_check("hipMemcpy", 0, 16, 16).is_ok());
        assert!(range_check("hipMemcpy", 8, 8, 16).is_ok());
        assert_eq!(
            range_check("hipMemcpy", 9, 8, 16),
            Err(HipError {
                call: "hipMemcpy",
                code: 1
            })
        );
        assert!(range_check("hipMemcpy", usize::MAX, 2, 16).is_err());
    }
}
