//! Run-time loader for the HIP runtime library (libamdhip64) and the raw C entry points we call.
//!
//! Owns: finding and `dlopen`ing libamdhip64, resolving every symbol we use into a table of function
//! pointers, the hipError_t name table and the few enum values we pass. Must not hold any policy:
//! the safe wrappers live in `runtime/`.
//!
//! Why run-time loading (not link-time through hip-runtime-sys):
//! * a binary linked on Debian records `NEEDED libamdhip64.so.5` and does not start at all on a ROCm 6 or
//!   7 host (SONAME .so.6 / .so.7) nor on a machine without ROCm, so the engine could never fall back to
//!   the CPU backend;
//! * every call below has the same C signature from ROCm 5.2 to 7.x, so one table
//!   serves all of them;
//! * results are read as raw `i32`, never as a Rust enum: newer runtimes return codes that 5.x bindings
//!   lack, and an unknown discriminant in a `#[repr(u32)]` enum would be undefined behaviour;
//! * no ROCm is needed to build, so CI builds `--features hip` without the SDK.
//!
//! Deliberately absent (their ABI changed between ROCm 5 and 7): hipGetDeviceProperties (struct layout
//! changed in ROCm 6), hipPointerGetAttributes (enum renumbered), the attributes renamed "Unused" in
//! ROCm 6 (Name, Uuid, Arch, GcnArch, GcnArchName), hipHostMalloc (deprecated).

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::fmt;
use std::sync::OnceLock;

/// A raw `hipError_t` as the runtime returned it.
pub type HipStatus = c_int;
/// `hipDevice_t` (an ordinal).
pub type HipDevice = c_int;
/// Opaque runtime handles: all pointers in every HIP version.
pub type RawStream = *mut c_void;
pub type RawEvent = *mut c_void;
pub type RawModule = *mut c_void;
pub type RawFunction = *mut c_void;
pub type RawGraph = *mut c_void;
pub type RawGraphExec = *mut c_void;
pub type RawGraphNode = *mut c_void;

pub const HIP_SUCCESS: HipStatus = 0;

/// hipMemcpyKind (unchanged 5.x → 7.x; same values as cudaMemcpyKind).
pub const MEMCPY_HOST_TO_DEVICE: c_int = 1;
pub const MEMCPY_DEVICE_TO_HOST: c_int = 2;
pub const MEMCPY_DEVICE_TO_DEVICE: c_int = 3;

/// Stream, event and host-registration flags (hip_runtime_api.h; unchanged 5.x → 7.x).
pub const STREAM_NON_BLOCKING: c_uint = 0x1;
pub const EVENT_DEFAULT: c_uint = 0x0;
pub const EVENT_DISABLE_TIMING: c_uint = 0x2;
pub const HOST_REGISTER_PORTABLE: c_uint = 0x1;
pub const HOST_REGISTER_MAPPED: c_uint = 0x2;
/// hipHostRegisterReadOnly in ROCm >= 6; the same bit is hipExtHostRegisterCoarseGrained in 5.x, which
/// also suits memory the device only reads.
pub const HOST_REGISTER_READ_ONLY: c_uint = 0x8;

/// Library names tried in order: the unversioned development link first (a ROCm install or a user's
/// override), then the SONAMEs of ROCm 7, 6 and 5 (Debian bookworm ships .so.5).
pub const LIBRARY_CANDIDATES: &[&str] = &[
    "libamdhip64.so",
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
];

/// Environment variable naming one library file to load instead of searching (tests, odd installs).
pub const LIBRARY_ENV: &str = "DS4_HIP_LIBRARY";

macro_rules! hip_api {
    ($( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty; )*
     optional: $( fn $oname:ident ( $($oarg:ident : $oty:ty),* $(,)? ) -> $oret:ty; )*) => {
        /// Function pointers into the loaded HIP runtime. All calls are `unsafe`: the caller must pass
        /// valid pointers and handles, exactly as the C API requires.
        #[allow(non_snake_case)]
        pub struct HipApi {
            /// The file name that was loaded (for messages).
            pub library: String,
            $( pub $name: unsafe extern "C" fn($($ty),*) -> $ret, )*
            $( pub $oname: Option<unsafe extern "C" fn($($oty),*) -> $oret>, )*
        }

        /// Every symbol the project resolves from libamdhip64; a replacement library (such as the
        /// HIP-on-CUDA test shim) must export all of them.
        pub const HIP_SYMBOLS: &[&str] = &[$(stringify!($name)),*];

        /// Entry points used where the library has them (newer runtimes only); the HIP-on-CUDA test
        /// shim exports them too.
        pub const HIP_OPTIONAL_SYMBOLS: &[&str] = &[$(stringify!($oname)),*];

        impl HipApi {
            /// Resolve every entry point from an open library handle.
            ///
            /// # Safety
            /// `handle` must be a live handle from `dlopen`, and the library's symbols must have the C
            /// signatures declared here (true for libamdhip64 5.2 → 7.x).
            unsafe fn resolve(handle: *mut c_void, library: String) -> Result<HipApi, LoadError> {
                Ok(HipApi {
                    $( $name: {
                        let p = unsafe { symbol(handle, concat!(stringify!($name), "\0")) }
                            .ok_or_else(|| LoadError::MissingSymbol {
                                library: library.clone(),
                                symbol: stringify!($name),
                            })?;
                        // SAFETY: a non-null code address of the function named above, whose C
                        // signature is the one declared in this table.
                        unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) -> $ret>(p)
                        }
                    }, )*
                    $( $oname: unsafe { symbol(handle, concat!(stringify!($oname), "\0")) }.map(|p| {
                        // SAFETY: as above.
                        unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($oty),*) -> $oret>(p)
                        }
                    }), )*
                    library,
                })
            }
        }
    };
}

hip_api! {
    fn hipInit(flags: c_uint) -> HipStatus;
    fn hipDriverGetVersion(version: *mut c_int) -> HipStatus;
    fn hipRuntimeGetVersion(version: *mut c_int) -> HipStatus;
    fn hipGetDeviceCount(count: *mut c_int) -> HipStatus;
    fn hipSetDevice(device: c_int) -> HipStatus;
    fn hipDeviceGetName(name: *mut c_char, len: c_int, device: HipDevice) -> HipStatus;
    fn hipDeviceTotalMem(bytes: *mut usize, device: HipDevice) -> HipStatus;
    fn hipDeviceGetAttribute(value: *mut c_int, attribute: c_int, device: c_int) -> HipStatus;
    fn hipDeviceSynchronize() -> HipStatus;
    fn hipGetErrorName(code: HipStatus) -> *const c_char;
    fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> HipStatus;
    fn hipMalloc(ptr: *mut *mut c_void, bytes: usize) -> HipStatus;
    fn hipFree(ptr: *mut c_void) -> HipStatus;
    fn hipMemcpy(dst: *mut c_void, src: *const c_void, bytes: usize, kind: c_int) -> HipStatus;
    fn hipMemcpyAsync(dst: *mut c_void, src: *const c_void, bytes: usize, kind: c_int, stream: RawStream) -> HipStatus;
    fn hipMemsetAsync(dst: *mut c_void, value: c_int, bytes: usize, stream: RawStream) -> HipStatus;
    fn hipStreamCreateWithFlags(stream: *mut RawStream, flags: c_uint) -> HipStatus;
    fn hipStreamSynchronize(stream: RawStream) -> HipStatus;
    fn hipStreamDestroy(stream: RawStream) -> HipStatus;
    fn hipStreamWaitEvent(stream: RawStream, event: RawEvent, flags: c_uint) -> HipStatus;
    fn hipEventCreateWithFlags(event: *mut RawEvent, flags: c_uint) -> HipStatus;
    fn hipEventRecord(event: RawEvent, stream: RawStream) -> HipStatus;
    fn hipEventSynchronize(event: RawEvent) -> HipStatus;
    fn hipEventElapsedTime(ms: *mut f32, start: RawEvent, stop: RawEvent) -> HipStatus;
    fn hipEventDestroy(event: RawEvent) -> HipStatus;
    fn hipModuleLoadData(module: *mut RawModule, image: *const c_void) -> HipStatus;
    fn hipModuleGetFunction(function: *mut RawFunction, module: RawModule, name: *const c_char) -> HipStatus;
    fn hipModuleUnload(module: RawModule) -> HipStatus;
    fn hipModuleLaunchKernel(
        function: RawFunction,
        grid_x: c_uint, grid_y: c_uint, grid_z: c_uint,
        block_x: c_uint, block_y: c_uint, block_z: c_uint,
        shared_bytes: c_uint, stream: RawStream,
        params: *mut *mut c_void, extra: *mut *mut c_void,
    ) -> HipStatus;
    fn hipStreamBeginCapture(stream: RawStream, mode: c_int) -> HipStatus;
    fn hipStreamEndCapture(stream: RawStream, graph: *mut RawGraph) -> HipStatus;
    fn hipGraphInstantiate(
        exec: *mut RawGraphExec, graph: RawGraph, error_node: *mut RawGraphNode, log: *mut c_char, log_len: usize,
    ) -> HipStatus;
    fn hipGraphLaunch(exec: RawGraphExec, stream: RawStream) -> HipStatus;
    fn hipGraphExecDestroy(exec: RawGraphExec) -> HipStatus;
    fn hipGraphDestroy(graph: RawGraph) -> HipStatus;
    fn hipHostRegister(ptr: *mut c_void, bytes: usize, flags: c_uint) -> HipStatus;
    fn hipHostGetDevicePointer(device_ptr: *mut *mut c_void, host_ptr: *mut c_void, flags: c_uint) -> HipStatus;
    fn hipHostUnregister(ptr: *mut c_void) -> HipStatus;
optional:
    // ROCm >= 6.2 and HIP on NVIDIA (cuLaunchKernelEx); used only for NVIDIA targets (LaunchOrder).
    fn hipDrvLaunchKernelEx(
        config: *const LaunchConfig, function: RawFunction, params: *mut *mut c_void, extra: *mut *mut c_void,
    ) -> HipStatus;
}

/// `HIP_LAUNCH_CONFIG` (hipDrvLaunchKernelEx's configuration; the layout of CUDA's `CUlaunchConfig`).
#[repr(C)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_bytes: c_uint,
    pub stream: RawStream,
    pub attrs: *mut LaunchAttribute,
    pub num_attrs: c_uint,
}

/// `hipLaunchAttribute` / `CUlaunchAttribute`: an id, padding to 8 bytes, a 64-byte value union of
/// which we set only the first int.
#[repr(C)]
pub struct LaunchAttribute {
    pub id: c_uint,
    pub pad: [u8; 4],
    pub value: [c_int; 16],
}

/// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION` (value 1: the launch may overlap the previous
/// kernel of its stream, whose completion the kernel awaits itself with `griddepcontrol.wait`). HIP
/// names no such attribute (AMD launches stay serialized); on NVIDIA, HIP hands launch attributes to
/// cuLaunchKernelEx unchanged, so the CUDA id is what reaches the driver.
pub const LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: c_uint = 6;

// SAFETY: the table holds plain code addresses; the HIP runtime is thread-safe.
unsafe impl Send for HipApi {}
unsafe impl Sync for HipApi {}

/// Why the HIP library could not be loaded.
#[derive(Clone, Debug, PartialEq)]
pub enum LoadError {
    /// No candidate could be opened; `detail` is the loader's message for the last one.
    NotFound { tried: Vec<String>, detail: String },
    /// The library opened but lacks an entry point we need (too old, or an incomplete replacement).
    MissingSymbol { library: String, symbol: &'static str },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::NotFound { tried, detail } => {
                write!(
                    f,
                    "HIP runtime library not found (tried {}): {detail}",
                    tried.join(", ")
                )
            }
            LoadError::MissingSymbol { library, symbol } => {
                write!(
                    f,
                    "{library} has no symbol {symbol} (HIP runtime too old or incomplete)"
                )
            }
        }
    }
}

/// Look one symbol up in an open library.
///
/// # Safety
/// `handle` must come from `dlopen`; `name` must be NUL-terminated.
unsafe fn symbol(handle: *mut c_void, name: &'static str) -> Option<*mut c_void> {
    let p = unsafe { libc::dlsym(handle, name.as_ptr().cast()) };
    (!p.is_null()).then_some(p)
}

fn last_dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated thread-local string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown loader error".to_string()
    } else {
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// Open the first library that loads among `names` and resolve the whole table from it.
/// The handle is never closed: HIP runtimes are not built to be unloaded.
pub fn load_from(names: &[&str]) -> Result<HipApi, LoadError> {
    let mut detail = String::from("no candidates");
    for name in names {
        let Ok(c_name) = CString::new(*name) else {
            detail = format!("{name:?} contains a NUL byte");
            continue;
        };
        // SAFETY: a NUL-terminated file name; RTLD_NOW resolves the library's own imports up front.
        let handle = unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            detail = last_dl_error();
            continue;
        }
        // SAFETY: live handle; the declared signatures hold for every supported HIP version.
        return unsafe { HipApi::resolve(handle, (*name).to_string()) };
    }
    Err(LoadError::NotFound {
        tried: names.iter().map(|s| s.to_string()).collect(),
        detail,
    })
}

/// The process-wide HIP table, loaded on first use: `$DS4_HIP_LIBRARY` if set, else the first of
/// `LIBRARY_CANDIDATES` that opens.
pub fn api() -> Result<&'static HipApi, LoadError> {
    static API: OnceLock<Result<HipApi, LoadError>> = OnceLock::new();
    API.get_or_init(|| match crate::backend::knobs::value(LIBRARY_ENV).ok().flatten() {
        Some(path) => load_from(&[path.as_str()]),
        None => load_from(LIBRARY_CANDIDATES),
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Name of a hipError_t value (HIP 5.2 → 7.x), or `None` for a value this table does not know.
pub fn error_name(code: HipStatus) -> Option<&'static str> {
    Some(match code {
        0 => "hipSuccess",
        1 => "hipErrorInvalidValue",
        2 => "hipErrorOutOfMemory",
        3 => "hipErrorNotInitialized",
        4 => "hipErrorDeinitialized",
        5 => "hipErrorProfilerDisabled",
        6 => "hipErrorProfilerNotInitialized",
        7 => "hipErrorProfilerAlreadyStarted",
        8 => "hipErrorProfilerAlreadyStopped",
        9 => "hipErrorInvalidConfiguration",
        12 => "hipErrorInvalidPitchValue",
        13 => "hipErrorInvalidSymbol",
        17 => "hipErrorInvalidDevicePointer",
        21 => "hipErrorInvalidMemcpyDirection",
        35 => "hipErrorInsufficientDriver",
        52 => "hipErrorMissingConfiguration",
        53 => "hipErrorPriorLaunchFailure",
        98 => "hipErrorInvalidDeviceFunction",
        100 => "hipErrorNoDevice",
        101 => "hipErrorInvalidDevice",
        200 => "hipErrorInvalidImage",
        201 => "hipErrorInvalidContext",
        202 => "hipErrorContextAlreadyCurrent",
        205 => "hipErrorMapFailed",
        206 => "hipErrorUnmapFailed",
        207 => "hipErrorArrayIsMapped",
        208 => "hipErrorAlreadyMapped",
        209 => "hipErrorNoBinaryForGpu",
        210 => "hipErrorAlreadyAcquired",
        211 => "hipErrorNotMapped",
        212 => "hipErrorNotMappedAsArray",
        213 => "hipErrorNotMappedAsPointer",
        214 => "hipErrorECCNotCorrectable",
        215 => "hipErrorUnsupportedLimit",
        216 => "hipErrorContextAlreadyInUse",
        217 => "hipErrorPeerAccessUnsupported",
        218 => "hipErrorInvalidKernelFile",
        219 => "hipErrorInvalidGraphicsContext",
        300 => "hipErrorInvalidSource",
        301 => "hipErrorFileNotFound",
        302 => "hipErrorSharedObjectSymbolNotFound",
        303 => "hipErrorSharedObjectInitFailed",
        304 => "hipErrorOperatingSystem",
        400 => "hipErrorInvalidHandle",
        401 => "hipErrorIllegalState",
        500 => "hipErrorNotFound",
        600 => "hipErrorNotReady",
        700 => "hipErrorIllegalAddress",
        701 => "hipErrorLaunchOutOfResources",
        702 => "hipErrorLaunchTimeOut",
        704 => "hipErrorPeerAccessAlreadyEnabled",
        705 => "hipErrorPeerAccessNotEnabled",
        708 => "hipErrorSetOnActiveProcess",
        709 => "hipErrorContextIsDestroyed",
        710 => "hipErrorAssert",
        712 => "hipErrorHostMemoryAlreadyRegistered",
        713 => "hipErrorHostMemoryNotRegistered",
        719 => "hipErrorLaunchFailure",
        720 => "hipErrorCooperativeLaunchTooLarge",
        801 => "hipErrorNotSupported",
        900 => "hipErrorStreamCaptureUnsupported",
        901 => "hipErrorStreamCaptureInvalidated",
        902 => "hipErrorStreamCaptureMerge",
        903 => "hipErrorStreamCaptureUnmatched",
        904 => "hipErrorStreamCaptureUnjoined",
        905 => "hipErrorStreamCaptureIsolation",
        906 => "hipErrorStreamCaptureImplicit",
        907 => "hipErrorCapturedEvent",
        908 => "hipErrorStreamCaptureWrongThread",
        910 => "hipErrorGraphExecUpdateFailure",
        999 => "hipErrorUnknown",
        1052 => "hipErrorRuntimeMemory",
        1053 => "hipErrorRuntimeOther",
        1054 => "hipErrorTbd",
        _ => return None,
    })
}

/// Name of a hipError_t value for messages: our table first, then the loaded runtime's own name for
/// codes newer than the table (it takes the code as a plain int, so any value is safe to pass).
pub fn describe_status(code: HipStatus) -> String {
    if let Some(name) = error_name(code) {
        return name.to_string();
    }
    if let Ok(api) = api() {
        // SAFETY: hipGetErrorName accepts any int and returns NULL or a static NUL-terminated string.
        let p = unsafe { (api.hipGetErrorName)(code) };
        if !p.is_null() {
            let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
            if s.starts_with("hip") && s != "hipErrorUnknown" {
                return s;
            }
        }
    }
    "unrecognised hipError_t".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_names_match_hip_header_values() {
        // Values from ROCm's hip_runtime_api.h (5.2 → 7.x), read off Debian's header with a C++ probe.
        assert_eq!(error_name(0), Some("hipSuccess"));
        assert_eq!(error_name(2), Some("hipErrorOutOfMemory"));
        assert_eq!(error_name(100), Some("hipErrorNoDevice"));
        assert_eq!(error_name(101), Some("hipErrorInvalidDevice"));
        assert_eq!(error_name(209), Some("hipErrorNoBinaryForGpu"));
        assert_eq!(error_name(719), Some("hipErrorLaunchFailure"));
        assert_eq!(error_name(999), Some("hipErrorUnknown"));
        assert_eq!(error_name(1054), Some("hipErrorTbd"));
        // Codes added after our table (ROCm 7: 911, 912, 914-916) and garbage are not guessed.
        for code in [-1, 10, 911, 916, 1055, i32::MAX] {
            assert_eq!(error_name(code), None, "code {code}");
        }
    }

    #[test]
    fn missing_library_is_reported_with_every_name_tried() {
        let names = ["/nonexistent/ds4/libamdhip64.so.9", "/nonexistent/ds4/other.so"];
        let err = load_from(&names).err().expect("a nonexistent path cannot load");
        match &err {
            LoadError::NotFound { tried, detail } => {
                assert_eq!(tried, &names.map(String::from).to_vec());
                assert!(detail.contains("/nonexistent/ds4/other.so"), "{detail}");
            }
            other => panic!("expected NotFound, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.starts_with("HIP runtime library not found (tried /nonexistent/ds4/libamdhip64.so.9, "),
            "{msg}"
        );
    }

    #[test]
    fn library_without_hip_symbols_is_rejected_by_name() {
        // libc opens everywhere but exports no hip* function: the first table entry is named.
        let err = load_from(&["libc.so.6"]).err().expect("libc is not a HIP runtime");
        assert_eq!(
            err,
            LoadError::MissingSymbol {
                library: "libc.so.6".into(),
                symbol: "hipInit"
            }
        );
        assert_eq!(
            err.to_string(),
            "libc.so.6 has no symbol hipInit (HIP runtime too old or incomplete)"
        );
    }

    #[test]
    fn symbol_table_avoids_abi_unsafe_calls() {
        // These changed layout or meaning across ROCm 5 → 7.
        for bad in [
            "hipGetDeviceProperties",
            "hipPointerGetAttributes",
            "hipHostMalloc",
            "hipGetDevicePropertiesR0600",
        ] {
            assert!(!HIP_SYMBOLS.contains(&bad), "{bad} must not be used");
        }
        let mut sorted = HIP_SYMBOLS.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), HIP_SYMBOLS.len(), "duplicate symbol in the table");
    }

    #[test]
    fn test_shim_exports_every_symbol_the_runtime_resolves() {
        // The HIP-on-CUDA shim must define each entry point (it is linked with -z now semantics by
        // dlopen(RTLD_NOW) and resolved by name here), and its version script must list it.
        let root = env!("CARGO_MANIFEST_DIR");
        let src = std::fs::read_to_string(format!("{root}/tests/hip-on-cuda/hip_on_cuda.cpp")).unwrap();
        let map = std::fs::read_to_string(format!("{root}/tests/hip-on-cuda/hip_amd.map")).unwrap();
        for sym in HIP_SYMBOLS.iter().chain(HIP_OPTIONAL_SYMBOLS) {
            let defined = src.contains(&format!("SHIM_EXPORT hipError_t {sym}("))
                || src.contains(&format!("SHIM_EXPORT const char* {sym}("));
            assert!(defined, "tests/hip-on-cuda/hip_on_cuda.cpp does not export {sym}");
            assert!(
                map.contains(&format!("    {sym};\n")),
                "hip_amd.map does not list {sym}"
            );
        }
        let exported = src.matches("SHIM_EXPORT ").count() - 1; // minus the #define line
        assert_eq!(
            exported,
            HIP_SYMBOLS.len() + HIP_OPTIONAL_SYMBOLS.len(),
            "the shim exports calls the runtime does not use"
        );
    }
}
