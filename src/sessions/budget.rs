//! The disk budget of KV snapshots: when the snapshots in the sessions directory hold more than the
//! budget, the least recently used ones (oldest modification time: a snapshot is touched whenever it
//! is written or loaded) are deleted until the rest fit. Session files are never deleted: a session
//! whose snapshot went is re-prefilled when it is opened.
//!
//! Owns the eviction order only.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// File name extension of snapshots.
pub const SNAPSHOT_EXT: &str = "kv";

/// Marks a snapshot used now.
pub fn touch(path: &Path) {
    if let Ok(f) = fs::File::options().append(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// The snapshots in `dir`: path, size, last use.
fn snapshots(dir: &Path) -> Vec<(PathBuf, u64, SystemTime)> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == SNAPSHOT_EXT))
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            m.is_file()
                .then(|| (e.path(), m.len(), m.modified().unwrap_or(SystemTime::UNIX_EPOCH)))
        })
        .collect()
}

/// Deletes the least recently used snapshots of `dir` until the rest hold at most `budget` bytes;
/// `keep` (the open session's) is never deleted. Returns the deleted files, in deletion order.
pub fn enforce(dir: &Path, budget: u64, keep: Option<&Path>) -> Vec<PathBuf> {
    let mut all = snapshots(dir);
    // Oldest first; ties by name so the order is stable.
    all.sort_by(|a, b| a.2.cmp(&b.2).then_with(|| a.0.cmp(&b.0)));
    let mut total: u64 = all.iter().map(|s| s.1).sum();
    let mut evicted = Vec::new();
    for (path, size, _) in all {
        if total <= budget {
            break;
        }
        if keep.is_some_and(|k| k == path) {
            continue;
        }
        if fs::remove_file(&path).is_ok() {
            total -= size;
            evicted.push(path);
        }
    }
    evicted
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_least_recently_used_snapshots_go_first_and_sessions_and_the_open_one_stay() {
        let dir = std::env::temp_dir().join(format!("ds4-chat-budget-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let t0 = SystemTime::now() - Duration::from_secs(1000);
        // a (oldest) .. e (newest), 100 bytes each; the open session is the oldest one.
        for (i, name) in ["a", "b", "c", "d", "e"].iter().enumerate() {
            let p = dir.join(format!("{name}.kv"));
            fs::write(&p, [0u8; 100]).unwrap();
            let f = fs::File::options().append(true).open(&p).unwrap();
            f.set_modified(t0 + Duration::from_secs(10 * i as u64)).unwrap();
            fs::write(dir.join(format!("{name}.json")), "{}").unwrap();
        }
        // Loading c makes it the most recently used.
        touch(&dir.join("c.kv"));
        let evicted = enforce(&dir, 250, Some(&dir.join("a.kv")));
        let names: Vec<String> = evicted
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["b.kv", "d.kv", "e.kv"]);
        let mut left: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["a.json", "a.kv", "b.json", "c.json", "c.kv", "d.json", "e.json"]);
        // Within the budget nothing goes.
        assert!(enforce(&dir, 200, None).is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }
}
