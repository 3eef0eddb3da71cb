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
//! * `device_model` — `HipModel`, the `DeviceModel` of the device: the device context, kernels and
//!   placed weights, loaded once; sessions (`HipSession`) are opened from it and share them.
//!   `open_model_with_progress` is what `engine::backend_open` calls.
//! * `acts` — the activation buffers, sized for the largest prefill chunk, and the step parameters.
//! * `prefill` — chunked prefill: the chunk size, when a batch takes the GEMMs and grouped experts.
//! * `footprint` — a session's device bytes (KV + scratch) from the shapes, for the memory guard.
//! * `cache` — the session cache on the device (`LayerState` per layer).
//! * `dspark_capture` — the device copies of DSpark's target rows, made only with a drafter attached.
//! * `lanes` — side streams for a sublayer's independent chains, forked and joined by events.
//! * `pass` — one launch sequence's view of a session (`Pass`) and the launch helpers.
//! * `attention_layer`, `ffn_layer` — the two sublayers' launches; `layers` — the sequence over
//!   every layer and the head for n tokens (decode n = 1, prefill chunks), and each layer's RoPE.
//! * `decode` — the decode step: step parameters, the captured graph, device sampling.
//! * `options` — `HipOptions`: prefill chunk, token-wise batch limit and decode graph of a session
//!   (from the environment by default).
//! * `session` — `HipSession`, the `DeviceSession` of the device: session buffers and `eval`;
//!   `session/state.rs` is its checkpoint payload (save_state / load_state).
//! * `open` — the policy `device_model` runs when a `HipModel` opens: the device memory guard and the
//!   weight placement plan (`PlacementPlan`); a failure is one line and `--backend auto` falls back
//!   to the CPU with it.
//! * `bandwidth` — peak device bandwidth (a timed device-to-device copy) for `bench`.
//! * `profile` — `DS4_HIP_PROFILE=1`: device time per kernel of the forward pass.
//! * `repeat` — `DS4_HIP_REPEAT=kernel,...`: those kernels twice per decode step (attribution runs).
//! * `selftest` — `ds4-chat selftest --backend hip`: the runtime's smoke checks, the kernel module's
//!   load and one launch, weight placement read back. `selftest --forward N` (`HipSession` against
//!   the CPU engine on a model) needs the sampler and so is `cli::selftest::forward`. Every kernel
//!   against the CPU reference is the test suite tests/hip_kernels (on the emulator in CI, on a GPU by carrying its binary).
//!
//! Dependencies run one way, in this order (a file uses only those before it; the
//! environment variables are read through `backend::knobs`): ffi → kernels (plain
//! data, also built without the feature) → runtime → kernel_module, profile, repeat, bandwidth → acts →
//! prefill → footprint → weights → cache → dspark_capture → lanes → pass → attention_layer,
//! ffn_layer → layers → decode → options → session → open (the placement policy) → device_model
//! (opening, sessions).
//!
//! Kernel images: AMD code objects are embedded by build.rs; on the NVIDIA test shim
//! (tests/hip-on-cuda) they come from `$DS4_KERNEL_DIR/<stem>.sm_<cc>.cubin`
//! (`HipContext::kernel_image_override`).

mod acts;
mod attention_layer;
mod attention_prefill;
pub mod bandwidth;
pub mod block;
pub mod cache;
mod decode;
pub mod device_model;
mod dspark_capture;
pub mod ffi;
mod ffn_layer;
pub mod footprint;
pub mod kernel_module;
pub mod kernels;
mod lanes;
mod layers;
pub mod open;
pub mod options;
mod pass;
pub mod prefill;
pub mod profile;
mod repeat;
pub mod runtime;
pub mod selftest;
pub mod session;
pub mod weight_load;
pub mod weights;

pub use decode::GRAPH_ENV;
pub use device_model::{open_backend, open_backend_with_progress, open_model_with_progress};
pub use lanes::LANES_ENV;
pub use options::HipOptions;
pub use runtime::{
    CaptureMode, DeviceAttribute, DeviceBuffer, DeviceCopy, DeviceInfo, DevicePtr, Event, Function, Graph, GraphExec,
    HipContext, HipError, HipResult, HipUnavailable, HostRegistration, KernelArgs, LaunchDims, Module, PinnedBuffer,
    Stream,
};
pub use session::HipSession;
