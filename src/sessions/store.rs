//! The sessions directory and its session files (docs/sessions.md#session-files): one pretty JSON
//! file per conversation, `ID.json`, with its KV snapshot `ID.kv` next to it. The directory is
//! `$DS4_DATA_DIR/sessions` when that variable is set (tests), else the platform data directory
//! (`directories`; on Linux `$XDG_DATA_HOME/ds4-chat/sessions`, by default
//! `~/.local/share/ds4-chat/sessions`).
//!
//! Owns the record type, listing, resolving `N|ID`, reading (with one-line errors) and atomic writes.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::atomic::write_atomic;
use super::budget::SNAPSHOT_EXT;
use crate::model::chat::{Message, Role};

/// Environment variable that moves the data directory (the sessions are in its `sessions/`).
pub const DATA_DIR_ENV: &str = "DS4_DATA_DIR";
/// Version of the session file format.
pub const SESSION_VERSION: u32 = 1;

/// The model a session was held with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelRef {
    /// File name (or "demo model (seed N)"), for the list.
    pub name: String,
    /// `ModelIdentity::to_text`.
    pub identity: String,
}

/// Settings a session restores.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionSettings {
    /// "off", "high" or "max".
    pub think: String,
    pub system: String,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub min_p: f32,
    pub seed: Option<u64>,
    pub max_tokens: u32,
}

/// The live transcript's token ids at the last turn boundary and how many messages (the system
/// message counted) they stand for: what a resumed session continues from token for token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TranscriptIds {
    pub messages: usize,
    pub ids: Vec<u32>,
}

/// One session file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRecord {
    pub version: u32,
    pub id: String,
    pub title: String,
    /// Unix seconds.
    pub created: u64,
    pub updated: u64,
    pub model: ModelRef,
    pub settings: SessionSettings,
    /// The turns, user and assistant (the system prompt is in `settings`).
    pub messages: Vec<Message>,
    /// Tokens the cache held at the last save (for the list).
    #[serde(default)]
    pub tokens: u32,
    #[serde(default)]
    pub transcript: Option<TranscriptIds>,
}

impl SessionRecord {
    /// The title a session gets: its first user line, at most 60 characters.
    pub fn title_from(messages: &[Message]) -> String {
        let first = messages
            .iter()
            .find(|m| m.role == Role::User)
            .and_then(|m| m.content.lines().find(|l| !l.trim().is_empty()))
            .unwrap_or("")
            .trim();
        let mut t: String = first.chars().take(60).collect();
        if first.chars().count() > 60 {
            t.push('…');
        }
        t
    }

    fn check(&self, file_id: &str) -> Result<(), String> {
        if self.version != SESSION_VERSION {
            return Err(format!(
                "version {}, this build reads version {SESSION_VERSION}",
                self.version
            ));
        }
        if self.id != file_id {
            return Err(format!("names session {:?}, not {file_id:?}", self.id));
        }
        if let Some(m) = self.messages.iter().find(|m| m.role == Role::System) {
            return Err(format!("a system message among the turns ({:.20}…)", m.content));
        }
        if super::identity::ModelIdentity::parse(&self.model.identity).is_none() {
            return Err(format!("bad model identity {:?}", self.model.identity));
        }
        if let Some(t) = &self.transcript
            && t.messages > self.messages.len() + 1
        {
            return Err(format!(
                "the transcript stands for {} messages, the session has {}",
                t.messages,
                self.messages.len()
            ));
        }
        Ok(())
    }
}

/// One line of `/sessions`.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionSummary {
    pub id: String,
    pub title: String,
    pub updated: u64,
    pub tokens: u32,
    pub model: String,
    pub identity: String,
    /// Whether its KV snapshot is on disk.
    pub has_snapshot: bool,
}

/// The data directory: `$DS4_DATA_DIR`, else the platform's.
pub fn data_dir() -> Option<PathBuf> {
    match crate::backend::knobs::path(DATA_DIR_ENV) {
        Some(d) => Some(d),
        None => directories::ProjectDirs::from("", "", "ds4-chat").map(|d| d.data_dir().to_path_buf()),
    }
}

/// The sessions directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// The sessions directory under the data directory; `None` without a home directory.
    pub fn default_location() -> Option<Store> {
        data_dir().map(|d| Store::at(d.join("sessions")))
    }

    pub fn at(dir: PathBuf) -> Store {
        Store { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn session_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    pub fn snapshot_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.{SNAPSHOT_EXT}"))
    }

    /// Writes a session file atomically (creating the directory).
    pub fn save(&self, rec: &SessionRecord) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir).map_err(|e| format!("cannot create {}: {e}", self.dir.display()))?;
        let text = serde_json::to_string_pretty(rec).map_err(|e| e.to_string())? + "\n";
        let path = self.session_path(&rec.id);
        write_atomic(&path, text.as_bytes()).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    /// Reads and checks session `id`; errors are one line naming the file.
    pub fn load(&self, id: &str) -> Result<SessionRecord, String> {
        let path = self.session_path(id);
        let text = std::fs::read_to_string(&path).map_err(|e| format!("session {id}: cannot read: {e}"))?;
        let rec: SessionRecord = serde_json::from_str(&text)
            .map_err(|e| format!("session {id}: not a session file: {}", e.to_string().replace('\n', " ")))?;
        rec.check(id).map_err(|e| format!("session {id}: {e}"))?;
        Ok(rec)
    }

    /// Deletes a session and its snapshot.
    pub fn delete(&self, id: &str) -> Result<(), String> {
        std::fs::remove_file(self.session_path(id)).map_err(|e| format!("session {id}: cannot delete: {e}"))?;
        let _ = std::fs::remove_file(self.snapshot_path(id));
        Ok(())
    }

    /// Every readable session, most recently updated first, and one line per file that is not.
    pub fn list(&self) -> (Vec<SessionSummary>, Vec<String>) {
        let mut out = Vec::new();
        let mut problems = Vec::new();
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return (out, problems);
        };
        let mut ids: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_suffix(".json")
                    .filter(|id| !id.starts_with('.'))
                    .map(str::to_string)
            })
            .collect();
        ids.sort();
        for id in ids {
            match self.load(&id) {
                Ok(r) => out.push(SessionSummary {
                    has_snapshot: self.snapshot_path(&id).is_file(),
                    id: r.id,
                    title: r.title,
                    updated: r.updated,
                    tokens: r.tokens,
                    model: r.model.name,
                    identity: r.model.identity,
                }),
                Err(e) => problems.push(e),
            }
        }
        out.sort_by(|a, b| b.updated.cmp(&a.updated).then_with(|| b.id.cmp(&a.id)));
        (out, problems)
    }

    /// The session `arg` names: its number in the list (1 = most recent), its id, or a prefix of
    /// exactly one id.
    pub fn resolve(&self, arg: &str) -> Result<String, String> {
        let (list, _) = self.list();
        if let Ok(n) = arg.parse::<usize>()
            && n >= 1
            && n <= list.len()
            && !list.iter().any(|s| s.id == arg)
        {
            return Ok(list[n - 1].id.clone());
        }
        if list.iter().any(|s| s.id == arg) {
            return Ok(arg.to_string());
        }
        let matches: Vec<&SessionSummary> = list.iter().filter(|s| s.id.starts_with(arg)).collect();
        match matches.as_slice() {
            [one] => Ok(one.id.clone()),
            [] if self.session_path(arg).is_file() => Ok(arg.to_string()),
            [] => Err(format!("no session {arg} (/sessions lists them)")),
            _ => Err(format!("{arg} names {} sessions; give more of the id", matches.len())),
        }
    }

    /// The most recently updated session held with the model `identity`.
    pub fn latest_for(&self, identity: &str) -> Option<String> {
        self.list().0.into_iter().find(|s| s.identity == identity).map(|s| s.id)
    }
}

/// Seconds since the Unix epoch.
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// (year, month, day, hour, minute, second) in UTC of Unix seconds `t`.
fn civil(t: u64) -> (i64, u32, u32, u32, u32, u32) {
    let days = (t / 86_400) as i64;
    let secs = t % 86_400;
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y,
        m,
        d,
        (secs / 3600) as u32,
        (secs / 60 % 60) as u32,
        (secs % 60) as u32,
    )
}

/// "2026-12-02 00:07" (UTC), for the list.
pub fn format_time(t: u64) -> String {
    let (y, mo, d, h, mi, _) = civil(t);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}")
}

/// A new session id: the UTC time and four hex digits that differ between processes,
/// "20261202-000733-1a2b".
pub fn new_id(t: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(t);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let salt = (nanos ^ std::process::id().rotate_left(16)) & 0xffff;
    format!("{y:04}{mo:02}{d:02}-{h:02}{mi:02}{s:02}-{salt:04x}")
}

#[cfg(test)]
mod tests;
