//! The inference engine above the backends: sessions, sampling, the worker thread and its metrics.
//!
//! Owns the session lifecycle and the message boundary to clients. Must not draw anything (`tui::`)
//! and must not contain kernels (`backend::`).

pub mod backend_open;
pub mod chat_text;
pub mod events;
pub mod generate;
pub mod loader;
pub mod logprobs;
pub mod metrics;
pub mod prompt_cache;
pub mod sampler;
pub mod settings;
pub mod warmup;
pub mod worker;
