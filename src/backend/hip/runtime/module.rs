//! Loaded code objects (`Module`) and their kernels (`Function`): lookup by name and launches with
//! packed arguments (`KernelArgs`, the kernels' one packer).

use std::ffi::{CString, c_void};
use std::sync::Arc;

use super::super::ffi;
use super::context::HipContext;
use super::stream::Stream;
use super::{HipError, HipResult, KernelArgs, check};

pub(super) struct ModuleInner {
    pub(super) ctx: HipContext,
    pub(super) raw: ffi::RawModule,
    pub(super) _image: Vec<u8>,
}

// SAFETY: a module handle may be used from any thread; the image is immutable.
unsafe impl Send for ModuleInner {}
unsafe impl Sync for ModuleInner {}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        // SAFETY: live module unloaded once, after every Function (which holds an Arc) is gone.
        let _ = unsafe { (self.ctx.api().hipModuleUnload)(self.raw) };
    }
}

/// A loaded code object.
#[derive(Clone)]
pub struct Module {
    pub(super) inner: Arc<ModuleInner>,
}

impl Module {
    /// Look a kernel up by its (unmangled, `extern "C"`) name.
    pub fn function(&self, name: &str) -> HipResult<Function> {
        let c_name = CString::new(name).map_err(|_| HipError {
            call: "hipModuleGetFunction",
            code: 1,
        })?;
        let mut raw: ffi::RawFunction = std::ptr::null_mut();
        // SAFETY: live module, NUL-terminated name, valid out-pointer.
        check("hipModuleGetFunction", unsafe {
            (self.inner.ctx.api().hipModuleGetFunction)(&mut raw, self.inner.raw, c_name.as_ptr())
        })?;
        Ok(Function {
            module: self.inner.clone(),
            raw,
            name: name.to_string(),
        })
    }
}

/// A kernel in a loaded module (keeps the module alive).
#[derive(Clone)]
pub struct Function {
    pub(super) module: Arc<ModuleInner>,
    pub(super) raw: ffi::RawFunction,
    pub(super) name: String,
}

// SAFETY: see Module.
unsafe impl Send for Function {}
unsafe impl Sync for Function {}

/// Grid and block shape of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchDims {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
}

/// How a launch is ordered after the previous kernel of its stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LaunchOrder {
    /// It starts once the previous kernel has completed (hipModuleLaunchKernel).
    #[default]
    Serial,
    /// It may start while the previous kernel runs, and its kernel awaits that kernel's completion
    /// itself before it reads that kernel's outputs (kernels/prelude.h `ds4_grid_sync`; CUDA's
    /// programmatic stream serialization through hipDrvLaunchKernelEx). NVIDIA sm_90 and later only.
    Overlapped,
}

impl LaunchDims {
    /// A 1-D launch of `blocks` blocks of `threads` threads.
    pub fn linear(blocks: u32, threads: u32) -> LaunchDims {
        LaunchDims {
            grid: [blocks, 1, 1],
            block: [threads, 1, 1],
            shared_bytes: 0,
        }
    }
}

impl Function {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Enqueue one launch on `stream`.
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list exactly (count, order, sizes), and every device
    /// pointer among them must stay valid until the kernel has run.
    pub unsafe fn launch(&self, stream: &Stream, dims: LaunchDims, args: &mut KernelArgs) -> HipResult<()> {
        unsafe { self.launch_ordered(stream, dims, args, LaunchOrder::Serial) }
    }

    /// `launch` in the given order: `Overlapped` where the runtime has hipDrvLaunchKernelEx, else
    /// serial (the same results, since an overlapped kernel waits for its predecessor anyway).
    ///
    /// # Safety
    /// As `launch`; with `Overlapped`, the kernel must call `ds4_grid_sync` as kernels/prelude.h says.
    pub unsafe fn launch_ordered(
        &self,
        stream: &Stream,
        dims: LaunchDims,
        args: &mut KernelArgs,
        order: LaunchOrder,
    ) -> HipResult<()> {
        let mut ptrs = args.pointers();
        // `kernelParams`: null for a kernel without arguments.
        let params = if ptrs.is_empty() {
            std::ptr::null_mut()
        } else {
            ptrs.as_mut_ptr()
        };
        match (order, self.module.ctx.api().hipDrvLaunchKernelEx) {
            (LaunchOrder::Overlapped, Some(launch_ex)) => unsafe {
                self.launch_overlapped(launch_ex, stream, dims, params)
            },
            _ => unsafe { self.launch_raw(stream, dims, params) },
        }
    }

    /// # Safety
    /// As `launch_raw`.
    unsafe fn launch_overlapped(
        &self,
        launch_ex: unsafe extern "C" fn(
            *const ffi::LaunchConfig,
            ffi::RawFunction,
            *mut *mut c_void,
            *mut *mut c_void,
        ) -> ffi::HipStatus,
        stream: &Stream,
        dims: LaunchDims,
        params: *mut *mut c_void,
    ) -> HipResult<()> {
        let mut attr = ffi::LaunchAttribute {
            id: ffi::LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: [0; 16],
        };
        attr.value[0] = 1;
        let config = ffi::LaunchConfig {
            grid: dims.grid,
            block: dims.block,
            shared_bytes: dims.shared_bytes,
            stream: stream.raw,
            attrs: &mut attr,
            num_attrs: 1,
        };
        // SAFETY: a live function and stream; the configuration and its one attribute outlive the
        // call; params as launch_raw's.
        check("hipDrvLaunchKernelEx", unsafe {
            launch_ex(&config, self.raw, params, std::ptr::null_mut())
        })
    }

    /// Enqueue one launch with a ready `kernelParams` array (one pointer per argument, or null).
    ///
    /// # Safety
    /// As `launch`; additionally each pointer must address the argument's bytes until this returns.
    unsafe fn launch_raw(&self, stream: &Stream, dims: LaunchDims, params: *mut *mut c_void) -> HipResult<()> {
        check("hipModuleLaunchKernel", unsafe {
            (self.module.ctx.api().hipModuleLaunchKernel)(
                self.raw,
                dims.grid[0],
                dims.grid[1],
                dims.grid[2],
                dims.block[0],
                dims.block[1],
                dims.block[2],
                dims.shared_bytes,
                stream.raw,
                params,
                std::ptr::null_mut(),
            )
        })
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::hip::runtime::DevicePtr;

    #[test]
    fn kernel_args_pack_each_value_at_its_own_pointer() {
        let mut args = KernelArgs::new();
        args.push(DevicePtr(0x1234_5678_9abc_def0))
            .push(-2.5f32)
            .push(7u32)
            .push(u64::MAX - 1)
            .push(-3i32);
        assert_eq!(args.len(), 5);
        let p = args.pointers();
        // SAFETY: each pointer addresses the bytes of the argument pushed at that index.
        unsafe {
            assert_eq!(*(p[0] as *const u64), 0x1234_5678_9abc_def0);
            assert_eq!(*(p[1] as *const f32), -2.5);
            assert_eq!(*(p[2] as *const u32), 7);
            assert_eq!(*(p[3] as *const u64), u64::MAX - 1);
            assert_eq!(*(p[4] as *const i32), -3);
        }
        // Every argument starts 8-byte aligned (pointers and u64 need it).
        assert!(p.iter().all(|q| (*q as usize).is_multiple_of(8)));
    }
}
