//! What the app's update functions ask the run loop to do outside the app state (send a command to
//! the engine worker, write a transcript file, set the clipboard) and the file write itself.
//!
//! Owns the `Effect` type and performing the file effects. `App` never touches files or the
//! terminal: it returns effects, the run loop (`tui::run`) performs them, and an outcome the user
//! must see comes back through the event channel (`AppEvent::TranscriptSaved`).

use std::path::PathBuf;

use super::event::AppEvent;
use crate::engine::events::Command;
use crate::sessions::write_atomic;

/// One thing to do outside the app state.
#[derive(Clone, Debug)]
pub enum Effect {
    /// A command for the engine worker.
    Engine(Command),
    /// Write `contents` to `path`, replacing it whole; the outcome comes back as
    /// `AppEvent::TranscriptSaved`.
    SaveTranscript { path: PathBuf, contents: String },
    /// Put text on the terminal's clipboard (OSC 52).
    CopyToClipboard(String),
    /// Read or write the sessions directory; the outcome comes back as `AppEvent::Session`.
    Session(crate::sessions::store::Store, crate::tui::app::sessions::SessionOp),
}

/// Writes a transcript and returns the event that reports how it went.
pub fn save_transcript(path: PathBuf, contents: &str) -> AppEvent {
    let result = write_atomic(&path, contents.as_bytes()).map_err(|e| e.to_string());
    AppEvent::TranscriptSaved { path, result }
}
