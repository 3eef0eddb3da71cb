//! ds4-chat: a terminal chat application with an in-process inference engine for DeepSeek V4 Flash.
//!
//! Layers, bottom up: `gguf` (file format) → `model` (hyperparameters, weights, tokenizer, chat) →
//! `backend` (CPU reference, HIP) → `engine` (session, sampler, worker, metrics) → `tui`. `remote`
//! stands beside `engine`: a worker with the same commands and events on an OpenAI-compatible server.
//! `units` (byte formatting) sits below them all. `cli` wires the subcommands; `genmodel` writes synthetic ds4-layout files for tests and `--demo`; `serve` is the OpenAI-compatible
//! HTTP server on the engine worker.

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
