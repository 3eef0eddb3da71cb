//! Safe wrappers over the HIP runtime: device, memory, streams, events, modules and launches, stream
//! capture into graphs, host registration and pinned host buffers.
//!
//! Owns the lifetime rules (every handle is freed by `Drop`) and the translation of raw status codes
//! into `HipError` values. Must not know about the model or the kernels' argument lists (the typed
//! launchers live in `kernels.rs`).
//!
//! Threads: HIP keeps the current device per host thread. `HipContext::new` binds the calling thread;
//! another thread that uses the same context should call `HipContext::bind_thread` once first (with a
//! single GPU every thread already defaults to device 0).

use std::alloc::Layout;
use std::ffi::{CString, c_int, c_void};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use super::ffi::{self, HipApi, HipStatus, LoadError};
use super::kernels::Arg;

/// The kernels' one argument packer (`kernels::KernelArgs`), under the runtime's name.
pub use super::kernels::KernelArgs;

/// A failed HIP call: which entry point and the raw status it returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HipError {
    pub call: &'static str,
    pub code: HipStatus,
}

impl fmt::Display for HipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} returned {} ({})",
            self.call,
            ffi::describe_status(self.code),
            self.code
        )
    }
}

impl std::error::Error for HipError {}

impl From<HipError> for crate::backend::EngineError {
    fn from(e: HipError) -> Self {
        crate::backend::EngineError::Device(e.to_string())
    }
}

pub type HipResult<T> = Result<T, HipError>;

fn check(call: &'static str, code: HipStatus) -> HipResult<()> {
    if code == ffi::HIP_SUCCESS {
        Ok(())
    } else {
        Err(HipError { call, code })
    }
}

/// Why no HIP device can be used. `Display` gives the one-line reason the engine shows when it falls
/// back to the CPU backend, e.g. "no AMD GPU: hipInit returned hipErrorInvalidDevice (101)".
#[derive(Clone, Debug, PartialEq)]
pub enum HipUnavailable {
    Library(LoadError),
    /// hipInit failed: on a machine without a usable AMD GPU ROCm returns hipErrorInvalidDevice (101)
    /// (toolchain notes §2), so this is the ordinary "no GPU" case, not a crash.
    Init(HipError),
    /// hipGetDeviceCount failed or found nothing.
    NoDevice(Option<HipError>),
    /// A device ordinal beyond the devices present.
    BadOrdinal {
        requested: i32,
        count: i32,
    },
    /// A later setup call (set device, name, memory size) failed.
    Setup(HipError),
}

impl fmt::Display for HipUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("no AMD GPU: ")?;
        match self {
            HipUnavailable::Library(e) => write!(f, "{e}"),
            HipUnavailable::Init(e) => write!(f, "{e}"),
            HipUnavailable::NoDevice(Some(e)) => write!(f, "{e}"),
            HipUnavailable::NoDevice(None) => f.write_str("hipGetDeviceCount found 0 devices"),
            HipUnavailable::BadOrdinal { requested, count } => {
                write!(f, "device {requested} requested but only {count} present")
            }
            HipUnavailable::Setup(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for HipUnavailable {}

impl From<HipUnavailable> for crate::backend::EngineError {
    fn from(e: HipUnavailable) -> Self {
        crate::backend::EngineError::Device(e.to_string())
    }
}

/// hipDeviceAttribute_t values we query: all unchanged from ROCm 5.2 to 7.x (toolchain notes §3), none
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

struct ContextInner {
    api: &'static HipApi,
    info: DeviceInfo,
}

/// One HIP device, shared by the buffers, streams and modules made from it (cheap to clone).
#[derive(Clone)]
pub struct HipContext {
    inner: Arc<ContextInner>,
}

/// Environment variable selecting the device ordinal (default 0).
pub const DEVICE_ENV: &str = "DS4_HIP_DEVICE";

impl HipContext {
    /// Load the runtime, initialise it and open device `$DS4_HIP_DEVICE` (default 0).
    pub fn new() -> Result<HipContext, HipUnavailable> {
        let ordinal = std::env::var(DEVICE_ENV)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
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

    /// Number of HIP devices, or the reason there are none usable.
    pub fn device_count() -> Result<i32, HipUnavailable> {
        let api = ffi::api().map_err(HipUnavailable::Library)?;
        let mut count: c_int = 0;
        // SAFETY: valid out-pointers.
        unsafe {
            check("hipInit", (api.hipInit)(0)).map_err(HipUnavailable::Init)?;
            check("hipGetDeviceCount", (api.hipGetDeviceCount)(&mut count))
                .map_err(|e| HipUnavailable::NoDevice(Some(e)))?;
        }
        Ok(count)
    }

    fn api(&self) -> &'static HipApi {
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

    pub fn attribute(&self, attr: DeviceAttribute) -> HipResult<i32> {
        let mut v: c_int = 0;
        // SAFETY: valid out-pointer.
        check("hipDeviceGetAttribute", unsafe {
            (self.api().hipDeviceGetAttribute)(&mut v, attr as c_int, self.inner.info.ordinal)
        })?;
        Ok(v)
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
        let Some(dir) = std::env::var_os(KERNEL_DIR_ENV).filter(|d| !d.is_empty()) else {
            return Ok(None);
        };
        let (major, minor) = self.inner.info.compute_capability;
        let path = PathBuf::from(dir).join(format!("{stem}.sm_{major}{minor}.cubin"));
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
    pub const NULL: DevicePtr = DevicePtr(0);

    /// The address `bytes` further on.
    pub fn offset(self, bytes: usize) -> DevicePtr {
        DevicePtr(self.0 + bytes as u64)
    }

    fn as_mut_ptr(self) -> *mut c_void {
        self.0 as usize as *mut c_void
    }
}

/// A device pointer passed to a kernel: its address.
impl From<DevicePtr> for Arg {
    fn from(p: DevicePtr) -> Arg {
        Arg::Ptr(p.0)
    }
}

fn range_check(call: &'static str, offset: usize, len: usize, size: usize) -> HipResult<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(HipError { call, code: 1 }), // hipErrorInvalidValue: refused before reaching the runtime
    }
}

/// Device memory owned by this value; freed on drop.
pub struct DeviceBuffer {
    ctx: HipContext,
    ptr: *mut c_void,
    bytes: usize,
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

    /// Enqueue a host → device copy on `stream`.
    ///
    /// # Safety
    /// `src` must stay alive and unmodified until the stream has passed this copy (synchronize it or
    /// wait on a later event). Use pinned memory for a truly asynchronous copy.
    pub unsafe fn copy_from_host_async<T: DeviceCopy>(
        &mut self,
        offset: usize,
        src: &[T],
        stream: &Stream,
    ) -> HipResult<()> {
        let n = std::mem::size_of_val(src);
        range_check("hipMemcpyAsync", offset, n, self.bytes)?;
        check("hipMemcpyAsync", unsafe {
            (self.ctx.api().hipMemcpyAsync)(
                self.ptr().offset(offset).as_mut_ptr(),
                src.as_ptr().cast(),
                n,
                ffi::MEMCPY_HOST_TO_DEVICE,
                stream.raw,
            )
        })
    }

    /// Enqueue a device → host copy on `stream`.
    ///
    /// # Safety
    /// `dst` must stay alive and must not be read until the stream has passed this copy.
    pub unsafe fn copy_to_host_async<T: DeviceCopy>(
        &self,
        offset: usize,
        dst: &mut [T],
        stream: &Stream,
    ) -> HipResult<()> {
        let n = std::mem::size_of_val(dst);
        range_check("hipMemcpyAsync", offset, n, self.bytes)?;
        check("hipMemcpyAsync", unsafe {
            (self.ctx.api().hipMemcpyAsync)(
                dst.as_mut_ptr().cast(),
                self.ptr().offset(offset).as_mut_ptr(),
                n,
                ffi::MEMCPY_DEVICE_TO_HOST,
                stream.raw,
            )
        })
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
        // SAFETY: in-bounds ranges of a live device allocation and a live pinned allocation.
        check("hipMemcpyAsync", unsafe {
            (self.ctx.api().hipMemcpyAsync)(
                self.ptr().offset(offset).as_mut_ptr(),
                src.ptr.cast(),
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

/// An ordered queue of device work.
pub struct Stream {
    ctx: HipContext,
    raw: ffi::RawStream,
}

// SAFETY: HIP streams may be used from any thread.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

/// hipStreamCaptureMode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum CaptureMode {
    Global = 0,
    ThreadLocal = 1,
    Relaxed = 2,
}

impl Stream {
    pub fn raw(&self) -> ffi::RawStream {
        self.raw
    }

    pub fn synchronize(&self) -> HipResult<()> {
        // SAFETY: live stream.
        check("hipStreamSynchronize", unsafe {
            (self.ctx.api().hipStreamSynchronize)(self.raw)
        })
    }

    /// Start recording this stream's work into a graph instead of running it.
    pub fn begin_capture(&self, mode: CaptureMode) -> HipResult<()> {
        // SAFETY: live stream.
        check("hipStreamBeginCapture", unsafe {
            (self.ctx.api().hipStreamBeginCapture)(self.raw, mode as c_int)
        })
    }

    /// Stop recording and return the captured graph.
    pub fn end_capture(&self) -> HipResult<Graph> {
        let mut raw: ffi::RawGraph = std::ptr::null_mut();
        // SAFETY: live stream, valid out-pointer.
        check("hipStreamEndCapture", unsafe {
            (self.ctx.api().hipStreamEndCapture)(self.raw, &mut raw)
        })?;
        Ok(Graph {
            ctx: self.ctx.clone(),
            raw,
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: live stream destroyed once.
        let _ = unsafe { (self.ctx.api().hipStreamDestroy)(self.raw) };
    }
}

/// A marker in a stream: for waiting and timing.
pub struct Event {
    ctx: HipContext,
    raw: ffi::RawEvent,
}

// SAFETY: HIP events may be used from any thread.
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Event {
    pub fn record(&self, stream: &Stream) -> HipResult<()> {
        // SAFETY: live event and stream.
        check("hipEventRecord", unsafe {
            (self.ctx.api().hipEventRecord)(self.raw, stream.raw)
        })
    }

    pub fn synchronize(&self) -> HipResult<()> {
        // SAFETY: live event.
        check("hipEventSynchronize", unsafe {
            (self.ctx.api().hipEventSynchronize)(self.raw)
        })
    }

    /// Milliseconds between `start` and `self` (both recorded, both timing events).
    pub fn elapsed_ms_since(&self, start: &Event) -> HipResult<f32> {
        let mut ms = 0f32;
        // SAFETY: live events, valid out-pointer.
        check("hipEventElapsedTime", unsafe {
            (self.ctx.api().hipEventElapsedTime)(&mut ms, start.raw, self.raw)
        })?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: live event destroyed once.
        let _ = unsafe { (self.ctx.api().hipEventDestroy)(self.raw) };
    }
}

struct ModuleInner {
    ctx: HipContext,
    raw: ffi::RawModule,
    _image: Vec<u8>,
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
    inner: Arc<ModuleInner>,
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
    module: Arc<ModuleInner>,
    raw: ffi::RawFunction,
    name: String,
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
        let mut ptrs = args.pointers();
        unsafe { self.launch_raw(stream, dims, &mut ptrs) }
    }

    /// Enqueue one launch with a ready `kernelParams` array (one pointer per argument).
    ///
    /// # Safety
    /// As `launch`; additionally each pointer must address the argument's bytes until this returns.
    pub unsafe fn launch_raw(&self, stream: &Stream, dims: LaunchDims, params: &mut [*mut c_void]) -> HipResult<()> {
        let params = if params.is_empty() {
            std::ptr::null_mut()
        } else {
            params.as_mut_ptr()
        };
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

/// A captured graph (a template; instantiate it to run it).
pub struct Graph {
    ctx: HipContext,
    raw: ffi::RawGraph,
}

// SAFETY: graph handles may be used from any thread.
unsafe impl Send for Graph {}

impl Graph {
    pub fn instantiate(&self) -> HipResult<GraphExec> {
        let mut raw: ffi::RawGraphExec = std::ptr::null_mut();
        // SAFETY: live graph; null error node and log are allowed by the API.
        check("hipGraphInstantiate", unsafe {
            (self.ctx.api().hipGraphInstantiate)(&mut raw, self.raw, std::ptr::null_mut(), std::ptr::null_mut(), 0)
        })?;
        Ok(GraphExec {
            ctx: self.ctx.clone(),
            raw,
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: live graph destroyed once.
        let _ = unsafe { (self.ctx.api().hipGraphDestroy)(self.raw) };
    }
}

/// An instantiated graph: replay it with `launch`.
pub struct GraphExec {
    ctx: HipContext,
    raw: ffi::RawGraphExec,
}

// SAFETY: executable graphs may be launched from any thread.
unsafe impl Send for GraphExec {}
unsafe impl Sync for GraphExec {}

impl GraphExec {
    pub fn launch(&self, stream: &Stream) -> HipResult<()> {
        // SAFETY: live executable graph and stream.
        check("hipGraphLaunch", unsafe {
            (self.ctx.api().hipGraphLaunch)(self.raw, stream.raw)
        })
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: live executable graph destroyed once.
        let _ = unsafe { (self.ctx.api().hipGraphExecDestroy)(self.raw) };
    }
}

/// Host memory registered with the runtime (page-locked; optionally mapped into the device's address
/// space), unregistered on drop. Borrowing the slice keeps the memory alive for the registration.
pub struct HostRegistration<'a> {
    ctx: HipContext,
    ptr: *mut c_void,
    len: usize,
    mapped: bool,
    _borrow: std::marker::PhantomData<&'a mut [u8]>,
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
    ctx: HipContext,
    ptr: *mut u8,
    len: usize,
    layout: Layout,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_reasons_read_as_one_line() {
        let init = HipUnavailable::Init(HipError {
            call: "hipInit",
            code: 101,
        });
        assert_eq!(
            init.to_string(),
            "no AMD GPU: hipInit returned hipErrorInvalidDevice (101)"
        );
        let none = HipUnavailable::NoDevice(None);
        assert_eq!(none.to_string(), "no AMD GPU: hipGetDeviceCount found 0 devices");
        let count = HipUnavailable::NoDevice(Some(HipError {
            call: "hipGetDeviceCount",
            code: 100,
        }));
        assert_eq!(
            count.to_string(),
            "no AMD GPU: hipGetDeviceCount returned hipErrorNoDevice (100)"
        );
        let ordinal = HipUnavailable::BadOrdinal { requested: 3, count: 1 };
        assert_eq!(ordinal.to_string(), "no AMD GPU: device 3 requested but only 1 present");
        let lib = HipUnavailable::Library(LoadError::NotFound {
            tried: vec!["libamdhip64.so".into(), "libamdhip64.so.5".into()],
            detail: "libamdhip64.so.5: cannot open shared object file".into(),
        });
        assert_eq!(
            lib.to_string(),
            "no AMD GPU: HIP runtime library not found (tried libamdhip64.so, libamdhip64.so.5): \
             libamdhip64.so.5: cannot open shared object file"
        );
        let engine: crate::backend::EngineError = init.into();
        assert_eq!(
            engine.to_string(),
            "device error: no AMD GPU: hipInit returned hipErrorInvalidDevice (101)"
        );
    }

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
