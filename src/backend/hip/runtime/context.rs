//! The device: `HipContext` (opened once, shared by every buffer, stream and module made from it),
//! what it reports about itself (`DeviceInfo`, `DeviceAttribute`), and the allocations, streams,
//! events and modules it makes.

use std::ffi::{c_int, c_void};
use std::path::PathBuf;
use std::sync::Arc;

use super::super::ffi::{self, HipApi};
use super::memory::{DeviceBuffer, DeviceCopy, DevicePtr};
use super::module::{Module, ModuleInner};
use super::stream::{Event, Stream};
use super::{HipError, HipResult, HipUnavailable, check};

/// hipDeviceAttribute_t values we query: all unchanged from ROCm 5.2 to 7.x, none
/// of the five renamed "Unused" in ROCm 6.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum DeviceAttribute {
    CanMapHostMemory = 3,
    ClockRateKhz = 5,
    Integrated = 16,
    L2CacheSize = 19,
    ComputeCapabilityMajor = 23,
    MaxThreadsPerBlock = 56,
    MemoryBusWidth = 59,
    ComputeCapabilityMinor = 61,
    MultiprocessorCount = 63,
    PageableMemoryAccess = 65,
    MaxSharedMemoryPerBlock = 74,
    UnifiedAddressing = 85,
    WarpSize = 87,
}

/// Static facts about the device, read once at context creation.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceInfo {
    pub ordinal: i32,
    pub name: String,
    pub total_mem: u64,
    /// (major, minor): gfx major/minor on AMD (gfx1151 → 11, 5), SM version on the NVIDIA test shim.
    pub compute_capability: (i32, i32),
    pub multiprocessors: i32,
    pub warp_size: i32,
    pub max_threads_per_block: i32,
    pub max_shared_per_block: i32,
    pub l2_cache: i32,
    pub integrated: bool,
    pub runtime_version: i32,
    pub driver_version: i32,
    pub library: String,
}

impl DeviceInfo {
    /// One line for logs and the selftest header.
    pub fn summary(&self) -> String {
        format!(
            "device {}: {} | cc {}.{} | {} CUs/SMs | wave {} | {:.1} GiB{} | runtime {} driver {} ({})",
            self.ordinal,
            self.name,
            self.compute_capability.0,
            self.compute_capability.1,
            self.multiprocessors,
            self.warp_size,
            self.total_mem as f64 / (1u64 << 30) as f64,
            if self.integrated { " (integrated)" } else { "" },
            self.runtime_version,
            self.driver_version,
            self.library
        )
    }
}

pub(super) struct ContextInner {
    pub(super) api: &'static HipApi,
    pub(super) info: DeviceInfo,
}

/// One HIP device, shared by the buffers, streams and modules made from it (cheap to clone).
#[derive(Clone)]
pub struct HipContext {
    pub(super) inner: Arc<ContextInner>,
}

/// Environment variable selecting the device ordinal (default 0).
pub const DEVICE_ENV: &str = "DS4_HIP_DEVICE";

impl HipContext {
    /// Load the runtime, initialise it and open device `$DS4_HIP_DEVICE` (default 0).
    pub fn new() -> Result<HipContext, HipUnavailable> {
        // A malformed value was refused at start (backend::knobs::validate).
        let ordinal = crate::backend::knobs::number::<i32>(DEVICE_ENV)
            .ok()
            .flatten()
            .unwrap_or(0);
        HipContext::with_device(ordinal)
    }

    /// Load the runtime, initialise it and open device `ordinal`.
    pub fn with_device(ordinal: i32) -> Result<HipContext, HipUnavailable> {
        let api = ffi::api().map_err(HipUnavailable::Library)?;
        // SAFETY: plain calls with valid out-pointers.
        unsafe {
            check("hipInit", (api.hipInit)(0)).map_err(HipUnavailable::Init)?;
            let mut count: c_int = 0;
            let code = (api.hipGetDeviceCount)(&mut count);
            if code != ffi::HIP_SUCCESS {
                return Err(HipUnavailable::NoDevice(Some(HipError {
                    call: "hipGetDeviceCount",
                    code,
                })));
            }
            if count <= 0 {
                return Err(HipUnavailable::NoDevice(None));
            }
            if ordinal < 0 || ordinal >= count {
                return Err(HipUnavailable::BadOrdinal {
                    requested: ordinal,
                    count,
                });
            }
            check("hipSetDevice", (api.hipSetDevice)(ordinal)).map_err(HipUnavailable::Setup)?;
            let mut name_buf = [0u8; 256];
            check(
                "hipDeviceGetName",
                (api.hipDeviceGetName)(name_buf.as_mut_ptr().cast(), name_buf.len() as c_int, ordinal),
            )
            .map_err(HipUnavailable::Setup)?;
            let name_len = name_buf.iter().position(|&b| b == 0).unwrap_or(name_buf.len());
            let name = String::from_utf8_lossy(&name_buf[..name_len]).trim().to_string();
            let mut total: usize = 0;
            check("hipDeviceTotalMem", (api.hipDeviceTotalMem)(&mut total, ordinal)).map_err(HipUnavailable::Setup)?;
            let mut runtime_version: c_int = 0;
            let mut driver_version: c_int = 0;
            // Versions are informational only; a failure leaves 0.
            let _ = (api.hipRuntimeGetVersion)(&mut runtime_version);
            let _ = (api.hipDriverGetVersion)(&mut driver_version);
            let attr = |a: DeviceAttribute| -> Result<i32, HipUnavailable> {
                let mut v: c_int = 0;
                check(
                    "hipDeviceGetAttribute",
                    (api.hipDeviceGetAttribute)(&mut v, a as c_int, ordinal),
                )
                .map_err(HipUnavailable::Setup)?;
                Ok(v)
            };
            let info = DeviceInfo {
                ordinal,
                name,
                total_mem: total as u64,
                compute_capability: (
                    attr(DeviceAttribute::ComputeCapabilityMajor)?,
                    attr(DeviceAttribute::ComputeCapabilityMinor)?,
                ),
                multiprocessors: attr(DeviceAttribute::MultiprocessorCount)?,
                warp_size: attr(DeviceAttribute::WarpSize)?,
                max_threads_per_block: attr(DeviceAttribute::MaxThreadsPerBlock)?,
                max_shared_per_block: attr(DeviceAttribute::MaxSharedMemoryPerBlock)?,
                l2_cache: attr(DeviceAttribute::L2CacheSize)?,
                integrated: attr(DeviceAttribute::Integrated)? != 0,
                runtime_version,
                driver_version,
                library: api.library.clone(),
            };
            Ok(HipContext {
                inner: Arc::new(ContextInner { api, info }),
            })
        }
    }

    pub(super) fn api(&self) -> &'static HipApi {
        self.inner.api
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    pub fn name(&self) -> &str {
        &self.inner.info.name
    }

    pub fn total_mem(&self) -> u64 {
        self.inner.info.total_mem
    }

    /// Make this context's device current on the calling thread.
    pub fn bind_thread(&self) -> HipResult<()> {
        // SAFETY: plain call.
        check("hipSetDevice", unsafe {
            (self.api().hipSetDevice)(self.inner.info.ordinal)
        })
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> HipResult<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        check("hipMemGetInfo", unsafe {
            (self.api().hipMemGetInfo)(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    /// Wait for all work on the device.
    pub fn synchronize(&self) -> HipResult<()> {
        // SAFETY: plain call.
        check("hipDeviceSynchronize", unsafe { (self.api().hipDeviceSynchronize)() })
    }

    /// Copy from any device address (a buffer, a mapped registration) into `dst` and wait for it.
    ///
    /// # Safety
    /// `src..src+dst.len()` must be readable device memory.
    pub unsafe fn copy_device_to_host(&self, src: DevicePtr, dst: &mut [u8]) -> HipResult<()> {
        check("hipMemcpy", unsafe {
            (self.api().hipMemcpy)(
                dst.as_mut_ptr().cast(),
                src.as_mut_ptr(),
                dst.len(),
                ffi::MEMCPY_DEVICE_TO_HOST,
            )
        })
    }

    /// Allocate `bytes` of device memory (uninitialised).
    pub fn alloc(&self, bytes: usize) -> HipResult<DeviceBuffer> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // hipMalloc(0) may return a null pointer; keep one byte so every buffer has a real address.
        // SAFETY: valid out-pointer.
        check("hipMalloc", unsafe { (self.api().hipMalloc)(&mut ptr, bytes.max(1)) })?;
        Ok(DeviceBuffer {
            ctx: self.clone(),
            ptr,
            bytes,
        })
    }

    /// Allocate a device buffer and fill it from `data` (synchronous).
    pub fn upload<T: DeviceCopy>(&self, data: &[T]) -> HipResult<DeviceBuffer> {
        let mut buf = self.alloc(std::mem::size_of_val(data))?;
        buf.copy_from_host(0, data)?;
        Ok(buf)
    }

    pub fn stream(&self) -> HipResult<Stream> {
        let mut raw: ffi::RawStream = std::ptr::null_mut();
        // SAFETY: valid out-pointer. Non-blocking: no implicit sync with the legacy null stream.
        check("hipStreamCreateWithFlags", unsafe {
            (self.api().hipStreamCreateWithFlags)(&mut raw, ffi::STREAM_NON_BLOCKING)
        })?;
        Ok(Stream { ctx: self.clone(), raw })
    }

    /// An event; `timing` events can measure elapsed time, others are cheaper sync points.
    pub fn event(&self, timing: bool) -> HipResult<Event> {
        let mut raw: ffi::RawEvent = std::ptr::null_mut();
        let flags = if timing {
            ffi::EVENT_DEFAULT
        } else {
            ffi::EVENT_DISABLE_TIMING
        };
        // SAFETY: valid out-pointer.
        check("hipEventCreateWithFlags", unsafe {
            (self.api().hipEventCreateWithFlags)(&mut raw, flags)
        })?;
        Ok(Event { ctx: self.clone(), raw })
    }

    /// Load a code object: an AMD code-object ELF (hsaco) on ROCm; a cubin or PTX on the NVIDIA test
    /// shim. The image is copied and kept alive with the module.
    pub fn load_module(&self, image: &[u8]) -> HipResult<Module> {
        if image.is_empty() {
            return Err(HipError {
                call: "hipModuleLoadData",
                code: 200, // hipErrorInvalidImage: refuse before handing the runtime an empty image
            });
        }
        // PTX must be NUL-terminated text; a trailing zero is harmless for ELF images.
        let mut owned = Vec::with_capacity(image.len() + 1);
        owned.extend_from_slice(image);
        owned.push(0);
        let mut raw: ffi::RawModule = std::ptr::null_mut();
        // SAFETY: valid out-pointer; `owned` outlives the module (stored below).
        check("hipModuleLoadData", unsafe {
            (self.api().hipModuleLoadData)(&mut raw, owned.as_ptr().cast())
        })?;
        Ok(Module {
            inner: Arc::new(ModuleInner {
                ctx: self.clone(),
                raw,
                _image: owned,
            }),
        })
    }

    /// On the NVIDIA test shim the kernels come from files built by nvcc rather than from the image
    /// embedded for AMD: when `$DS4_KERNEL_DIR` is set this returns the bytes of
    /// `$DS4_KERNEL_DIR/<stem>.sm_<major><minor>.cubin` (e.g. `ds4_kernels.sm_90.cubin`), an error if
    /// that file is missing, and `None` when the variable is unset.
    pub fn kernel_image_override(&self, stem: &str) -> Result<Option<(PathBuf, Vec<u8>)>, String> {
        let Some(dir) = crate::backend::knobs::path(KERNEL_DIR_ENV) else {
            return Ok(None);
        };
        let (major, minor) = self.inner.info.compute_capability;
        let path = dir.join(format!("{stem}.sm_{major}{minor}.cubin"));
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some((path, bytes))),
            Err(e) => Err(format!(
                "{KERNEL_DIR_ENV} is set but {} cannot be read: {e}",
                path.display()
            )),
        }
    }
}

/// Directory holding nvcc-built kernel images for the NVIDIA test shim.
pub const KERNEL_DIR_ENV: &str = "DS4_KERNEL_DIR";
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_on_a_machine_without_gpu_fails_with_a_reason() {
        // CI and the development machines have no AMD GPU: with or without libamdhip64 installed the
        // context must fail cleanly (no panic, no crash) and say why. On a machine with a GPU the
        // context opens instead and the test checks the device looks sane.
        match HipContext::new() {
            Ok(ctx) => {
                eprintln!("HIP device present: {}", ctx.info().summary());
                assert!(ctx.total_mem() > 0);
                assert!(ctx.info().warp_size == 32 || ctx.info().warp_size == 64);
            }
            Err(e) => {
                let msg = e.to_string();
                eprintln!("no HIP device here: {msg}");
                assert!(msg.starts_with("no AMD GPU: "), "{msg}");
                assert!(!msg.contains('\n'), "{msg}");
                match e {
                    HipUnavailable::Library(_) | HipUnavailable::Init(_) | HipUnavailable::NoDevice(_) => {}
                    other => panic!("unexpected failure kind without a GPU: {other:?}"),
                }
            }
        }
    }
}
