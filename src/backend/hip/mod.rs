//! HIP backend. Filled in by the GPU work.
