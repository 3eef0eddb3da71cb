//! The chat app on an OpenAI-compatible server instead of the in-process engine (`--remote`):
//! vLLM, SGLang, llama-server, ds4-server or our own `serve`.
//!
//! A remote worker takes the engine worker's `Command`s and answers with the same `Event`s
//! (`engine::events`), so the TUI drives either one through the same channel. Owns the endpoint
//! (`target`), the HTTP calls and their one-line errors (`client`), the request body (`request`),
//! the stream's framing (`sse`), its JSON chunks (`chunk`), reasoning written inline as
//! `<think>…</think>` (`think`), the reading thread (`stream`) and the command loop (`worker`).
//! Layer: above `engine`, below `tui` (src/lib.rs). Must not know terminal types; the engine itself
//! is never loaded here.

pub mod chunk;
pub mod client;
pub mod request;
pub mod sse;
pub mod stream;
pub mod target;
pub mod think;
pub mod worker;

pub use target::RemoteTarget;
pub use worker::spawn;
