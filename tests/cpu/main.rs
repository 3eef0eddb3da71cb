//! The model stack on the CPU: GGUF reading and dequantization, the tokenizer and chat template,
//! the CPU engine against antirez/ds4's reference vectors, synthetic models, and sessions carried
//! through snapshots, and the prompt store on disk.
//!
//! One test binary of modules, so the crate is linked once for all of them (tests/README.md).
//! With `--features hip`, `vectors::case_a_hip` runs the same vectors on the kernel emulator.

#[path = "../block_verify_common/mod.rs"]
mod block_verify_common;
#[path = "../common/mod.rs"]
mod common;
#[path = "../dspark_common/mod.rs"]
mod dspark_common;
#[cfg(feature = "hip")]
#[path = "../hip_emu/mod.rs"]
mod hip_emu;
#[path = "../sessions_common/mod.rs"]
mod sessions_common;
#[path = "../speculative_common/mod.rs"]
mod speculative_common;
#[path = "../support/mod.rs"]
mod support;

mod block_verify;
mod chat_render;
mod chat_render_0731;
mod cpu_engine;
mod cpu_expert_types;
mod ctx_session;
mod dequant_fixtures;
mod detok_stream;
mod dspark_drafter;
mod fuzz_corpus;
mod genmodel_tiny;
mod official_vectors;
mod prompt_store;
mod real_model_speculate;
mod sessions_resume;
mod small_model;
mod speculative_decode;
mod tokenizer_corpus;
mod tool_render;
mod vectors;
