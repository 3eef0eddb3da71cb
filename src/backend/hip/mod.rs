//! HIP backend. Filled in by the GPU work.
//!
//! * `kernels` — the kernels' C ABI: names, parameter lists, typed launch builders, embedded code objects.

pub mod kernels;
