//! The HIP backend end to end on the kernel emulator (kernels/emu/hip_api.cpp, built by
//! tests/hip_emu): decode, chunked prefill, decode graphs, fast arithmetic, long context and
//! the DSpark drafter against the CPU engine. Needs `--features hip`.
//!
//! tests/hip_emu_load.rs and tests/hip_emu_product.rs are binaries of their own: they change the
//! emulated device's memory through the environment, which no other test of their process may
//! read meanwhile.
#![cfg(feature = "hip")]

#[path = "../block_verify_common/mod.rs"]
mod block_verify_common;
#[path = "../dspark_common/mod.rs"]
mod dspark_common;
#[path = "../hip_emu/mod.rs"]
mod hip_emu;
#[path = "../sessions_common/mod.rs"]
mod sessions_common;
#[path = "../speculative_common/mod.rs"]
mod speculative_common;
#[path = "../support/mod.rs"]
mod support;

// The emulator tests use the model builders, not every helper the CPU tests share.
#[allow(dead_code)]
#[path = "../cpu/small_model.rs"]
mod small_model;

mod dspark;
mod fast;
mod forward;
mod graph;
mod longctx;
mod prefill;
mod speculative;
mod verify;
