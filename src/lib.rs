//! ds4-chat: a terminal chat application with an in-process inference engine for DeepSeek V4 Flash.
//!
//! # Layers
//!
//! The top-level modules form one order, bottom up; a module imports only modules to its left
//! (tests/layering.rs reads the line below and fails on any `crate::` or `super::` path against it,
//! `#[cfg(test)]` code included, and on any import cycle between top-level modules):
//!
//! layers: units → gguf → model → genmodel → backend → sessions → engine → remote → {tui, serve} → cli
//!
//! * `units` — byte counts and their formatting.
//! * `gguf` — the GGUF file format: reading, writing, the quantized types and their dequantization.
//! * `model` — what DeepSeek V4 Flash *is*: hyperparameters, tensor layout and binding, tokenizer,
//!   chat rendering, streaming detokenization (and its `TextKind`).
//! * `genmodel` — synthetic ds4-layout model files for tests and `--demo`.
//! * `backend` — the forward pass on a device: the CPU reference and HIP. A `DeviceModel` is the
//!   model loaded once onto a device, a `DeviceSession` one cache and its logits opened from it.
//!   Also the host facts that decide whether and where a model fits: the memory guard, the copy
//!   budget of a GPU weight copy, the page-cache residency of the model file.
//! * `sessions` — saved chats on disk (`--session`, `--resume`): transcripts, KV snapshots, budget.
//! * `engine` — above the backends: the prompt cache over a device session, sampling, the worker
//!   thread and its command/event boundary, opening a model on the chosen device, settings.
//! * `remote` — a worker with the engine's commands and events that talks to an OpenAI-compatible
//!   server (`--remote`).
//! * `tui` — the terminal app; `serve` — the OpenAI-compatible HTTP server on the engine worker.
//!   The two are side by side and import neither each other.
//! * `cli` — the subcommands, wiring everything above (and the diagnostics that need all of it, such
//!   as `selftest --forward`).

pub mod backend;
pub mod cli;
pub mod engine;
pub mod genmodel;
pub mod gguf;
pub mod model;
pub mod remote;
pub mod serve;
pub mod sessions;
pub mod tui;
pub mod units;
