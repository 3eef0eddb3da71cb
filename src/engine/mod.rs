//! The inference engine above the backends: opening a model on the chosen device (`backend_open`),
//! the prompt cache over a device session (`prompt_cache`) and its store on disk (`prompt_store`),
//! sampling, the worker thread, its command/event boundary (`events`) and its metrics, speculative
//! decoding's drafters, acceptance rules and scheduler (`speculate`), and a scripted engine for
//! end-to-end tests of the server (`scripted`).
//!
//! Owns the turn lifecycle and the message boundary to clients. Layer: above `backend` and
//! `sessions`, below `remote`, `tui`, `serve` and `cli` (src/lib.rs). Must not draw anything
//! (`tui::`) and must not contain kernels or device memory policy (`backend::`).

pub mod backend_open;
pub mod chat_text;
pub mod events;
pub mod generate;
pub mod loader;
pub mod logprobs;
pub mod metrics;
pub mod prompt_cache;
pub mod prompt_store;
pub mod sampler;
pub mod scripted;
pub mod settings;
pub mod speculate;
pub mod warmup;
pub mod worker;
