//! Conversations kept on disk (docs/sessions.md): every chat is a session file in the data directory
//! (its messages, settings, the model's identity, the live transcript's token ids), next to it a KV
//! snapshot of the session's cache that resuming loads instead of prefilling the conversation again,
//! and a disk budget that drops the least recently used snapshots (never the conversations).
//!
//! Owns the file formats, the directory and the budget. Layer: below `engine` (src/lib.rs); the
//! snapshot holds a backend's cache rows (`backend::cache_rows`). Must not know about the engine
//! worker or the terminal: the worker writes and reads snapshots through `snapshot`, the app reads and writes
//! session files through `store`.

pub mod atomic;
pub mod budget;
pub mod identity;
pub mod snapshot;
pub mod store;

pub use atomic::write_atomic;
pub use identity::ModelIdentity;
