//! Replacing a file all at once: what `/save` and every session and snapshot write use, so a crash,
//! a `kill -9` or a full disk leaves the old file or the new one, never a part.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

/// Replaces `path` with `bytes`: the bytes go to a temporary file in the same directory, are flushed
/// to disk, and the file is renamed over `path`. On any failure the temporary file is removed, so
/// `path` holds either its old contents or the new ones.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_with(path, |f| f.write_all(bytes))
}

/// As [`write_atomic`], with the contents written by `fill` (a large snapshot is streamed instead
/// of built in memory first).
pub fn write_atomic_with(path: &Path, fill: impl FnOnce(&mut File) -> io::Result<()>) -> io::Result<()> {
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
    let written = fill(&mut file)
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

/// Whether `name` is a temporary file `write_atomic` left behind (a killed writer).
pub fn is_temporary(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".tmp")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fresh scratch directory, removed (with what is in it) on drop.
    struct ScratchDir(PathBuf);

    impl ScratchDir {
        fn new(tag: &str) -> ScratchDir {
            let d = std::env::temp_dir().join(format!("ds4-chat-atomic-{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&d);
            fs::create_dir_all(&d).unwrap();
            ScratchDir(d)
        }
    }

    impl std::ops::Deref for ScratchDir {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for ScratchDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
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
        let dir = ScratchDir::new("replace");
        let path = dir.join("t.md");
        fs::write(&path, "old contents, longer than the new ones").unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(entries(&dir), vec!["t.md"]);
    }

    #[test]
    fn a_failed_rename_removes_the_temporary_and_keeps_the_target() {
        let dir = ScratchDir::new("fail");
        // A directory cannot be replaced by a file: the rename fails after the bytes were written.
        let target = dir.join("taken");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("keep"), "x").unwrap();
        assert!(write_atomic(&target, b"data").is_err());
        assert_eq!(entries(&dir), vec!["taken"]);
        assert_eq!(entries(&target), vec!["keep"]);
    }

    #[test]
    fn a_failing_writer_keeps_the_old_file() {
        let dir = ScratchDir::new("writer");
        let path = dir.join("s.kv");
        fs::write(&path, "old").unwrap();
        let full = io::Error::new(io::ErrorKind::StorageFull, "no space left on device");
        let e = write_atomic_with(&path, |f| f.write_all(b"part").and(Err(full))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        assert_eq!(fs::read_to_string(&path).unwrap(), "old");
        assert_eq!(entries(&dir), vec!["s.kv"]);
        assert!(is_temporary(".s.kv.123.tmp") && !is_temporary("s.kv"));
    }
}
