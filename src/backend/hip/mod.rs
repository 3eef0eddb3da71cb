//! HIP backend (feature `hip`): AMD GPUs through ROCm's HIP runtime, loaded at run time.
//!
//! * `ffi` — finds and loads libamdhip64 (`dlopen`), the raw entry points, error names.
//! * `runtime` — safe wrappers: `HipContext` (device), `DeviceBuffer`, `Stream`, `Event`, `Module` /
//!   `Function` / `KernelArgs`, stream capture into `Graph` / `GraphExec`, `HostRegistration`,
//!   `PinnedBuffer`. `HipContext::new()` failing gives the one-line reason shown when the engine
//!   falls back to the CPU backend.
//! * `kernels` — the kernels' C ABI: names, parameter lists, typed launch builders, embedded code
//!   objects (kernels/*.hip; owned by the kernel work).
//! * `kernel_module` — loads the kernel image that fits the device and runs `kernels::Launch` values.
//! * `weights` — the model's tensor data on the device: copied (pread through pinned staging buffers)
//!   or mapped zero-copy (the registered file mapping).
//! * `engine` — `HipEngine`: the device context, kernels and placed weights, loaded once; sessions
//!   (`HipBackend`) are opened from it and share them.
//! * `forward` — `HipBackend`, the device forward pass: session state and `eval` (decode steps,
//!   prefill chunks); `forward/state.rs` is its checkpoint payload (save_state / load_state).
//! * `prefill` — the launch sequence for n tokens (decode n = 1; prefill chunks with batched GEMMs and
//!   experts grouped by id) and the activation buffers sized for the largest chunk.
//! * `backend` — `open_backend`, called by `engine::backend_open`: the forward-pass gate
//!   (`FORWARD_VALIDATED`, `DS4_HIP_FORWARD`), the device memory guard and the weight placement
//!   policy; a failure is one line and `--backend auto` falls back to the CPU with it.
//! * `footprint` — a session's device bytes (KV + scratch) from the shapes, for the memory guard.
//! * `bandwidth` — peak device bandwidth (a timed device-to-device copy) for `bench`.
//! * `profile` — `DS4_HIP_PROFILE=1`: device time per kernel of the forward pass.
//! * `selftest` — `ds4-chat selftest --backend hip`: the runtime's smoke checks, the kernel module's
//!   load and one launch, weight placement read back; `selftest_forward` — `selftest --forward N`:
//!   `HipBackend` against the CPU engine on a model. Every kernel against the CPU reference is the
//!   test suite tests/hip_kernels (on the emulator in CI, on a GPU by carrying its binary).
//!
//! Kernel images: AMD code objects are embedded by build.rs; on the NVIDIA test shim
//! (tests/hip-on-cuda) they come from `$DS4_KERNEL_DIR/<stem>.sm_<cc>.cubin`
//! (`HipContext::kernel_image_override`).

pub mod backend;
pub mod bandwidth;
pub mod engine;
pub mod ffi;
pub mod footprint;
pub mod forward;
pub mod kernel_module;
pub mod kernels;
pub mod prefill;
pub mod profile;
pub mod runtime;
pub mod selftest;
pub mod selftest_forward;
pub mod weights;

pub use backend::open_backend;
pub use runtime::{
    CaptureMode, DeviceAttribute, DeviceBuffer, DeviceCopy, DeviceInfo, DevicePtr, Event, Function, Graph, GraphExec,
    HipContext, HipError, HipResult, HipUnavailable, HostRegistration, KernelArgs, LaunchDims, Module, PinnedBuffer,
    Stream,
};
