//! What the app's update functions ask the run loop to do outside the app state (send a command to
//! the engine worker, write a transcript file, set the clipboard) and the file write itself.
//!
//! Owns the `Effect` type and performing the file effects. `App` never touches files or the
//! terminal: it returns effects, the run loop (`tui::run`) performs them, and an outcome the user
//! must see comes back through the event channel (`AppEvent::TranscriptSaved`).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::event::AppEvent;
use crate::engine::events::Command;

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
}

/// Writes a transcript and returns the event that reports how it went.
pub fn save_transcript(path: PathBuf, contents: &str) -> AppEvent {
    let result = write_atomic(&path, contents.as_bytes()).map_err(|e| e.to_string());
    AppEvent::TranscriptSaved { path, result }
}

/// Replaces `path` with `bytes` all at once: the bytes go to a temporary file in the same directory,
/// are flushed to disk, and the file is renamed over `path`. On any failure the temporary file is
/// removed, so `path` holds either its old contents or the new ones, never a part.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file name"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);
    let mut file = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .and_then(|()| fs::rename(&tmp, path));
    drop(file);
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    // The rename is durable once the directory entry is on disk; a directory that cannot be
    // opened or synced (some file systems) still has the complete file.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ds4-chat-effect-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn write_atomic_replaces_the_file_and_leaves_no_temporary() {
        let dir = scratch_dir("replace");
        let path = dir.join("t.md");
        fs::write(&path, "old contents, longer than the new ones").unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(entries(&dir), vec!["t.md"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_rename_removes_the_temporary_and_keeps_the_target() {
        let dir = scratch_dir("fail");
        // A directory cannot be replaced by a file: the rename fails after the bytes were written.
        let target = dir.join("taken");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("keep"), "x").unwrap();
        assert!(write_atomic(&target, b"data").is_err());
        assert_eq!(entries(&dir), vec!["taken"]);
        assert_eq!(entries(&target), vec!["keep"]);
        fs::remove_dir_all(&dir).unwrap();
    }
}
