//! Safe wrappers over the HIP runtime: device, memory, streams, events, modules and launches, stream
//! capture into graphs, host registration and pinned host buffers.
//!
//! Owns the lifetime rules (every handle is freed by `Drop`) and the translation of raw status codes
//! into `HipError` values. Must not know about the model or the kernels' argument lists (the typed
//! launchers live in `kernels/`).
//!
//! Threads: HIP keeps the current device per host thread. `HipContext::new` binds the calling thread;
//! another thread that uses the same context should call `HipContext::bind_thread` once first (with a
//! single GPU every thread already defaults to device 0).
//!
//! Files: `context` (the device), `memory` (device buffers and copies), `stream` (streams, events,
//! graphs), `module` (code objects, kernels, launches), `host` (registered and pinned host memory).
//! Every public item is re-exported here: callers name them `runtime::X`.

use std::fmt;

use super::ffi::{self, HipStatus, LoadError};

mod context;
mod host;
mod memory;
mod module;
mod stream;

/// The kernels' one argument packer (`kernels::KernelArgs`), under the runtime's name.
pub use super::kernels::KernelArgs;
pub use context::{DEVICE_ENV, DeviceAttribute, DeviceInfo, HipContext, KERNEL_DIR_ENV};
pub use host::{HostRegistration, PinnedBuffer};
pub use memory::{DeviceBuffer, DeviceCopy, DevicePtr};
pub use module::{Function, LaunchDims, LaunchOrder, Module};
pub use stream::{CaptureMode, Event, Graph, GraphExec, Stream};

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

impl From<HipError> for crate::backend::BackendError {
    fn from(e: HipError) -> Self {
        crate::backend::BackendError::Device(e.to_string())
    }
}

pub type HipResult<T> = Result<T, HipError>;

pub(super) fn check(call: &'static str, code: HipStatus) -> HipResult<()> {
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
    /// hipInit failed: on a machine without a usable AMD GPU ROCm returns hipErrorInvalidDevice (101),
    /// so this is the ordinary "no GPU" case, not a crash.
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

impl From<HipUnavailable> for crate::backend::BackendError {
    fn from(e: HipUnavailable) -> Self {
        crate::backend::BackendError::Device(e.to_string())
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
        let engine: crate::backend::BackendError = init.into();
        assert_eq!(
            engine.to_string(),
            "device error: no AMD GPU: hipInit returned hipErrorInvalidDevice (101)"
        );
    }
}
