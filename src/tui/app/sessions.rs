//! Kept conversations in the app (docs/sessions.md): the open session's id and title, saving it
//! after every finished turn (the worker writes the KV snapshot, then the session file is written
//! with the transcript the worker reports), `--resume` / `--session`, the `/sessions` list and the
//! `/load /new /delete /rename` commands.
//!
//! Owns `SessionsState` and the app's session flow. Files are read and written by the run loop
//! (`tui::session_io`), which answers with `AppEvent::Session`.

use super::state::TurnState;
use super::{App, Item, Phase, Turn};
use crate::engine::events::{Command, FinishReason, ResumeRequest};
use crate::engine::settings;
use crate::model::chat::{Message, Role};
use crate::sessions::store::{self, ModelRef, SessionRecord, SessionSettings, SessionSummary, Store, TranscriptIds};
use crate::tui::effect::Effect;

/// Which saved session to open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpenWhich {
    /// The most recent one of the loaded model (`--resume`).
    Latest,
    /// A number of the list, an id or an id prefix (`--session`, `/load`).
    Named(String),
}

/// A file operation on the sessions directory, performed by the run loop.
#[derive(Clone, Debug)]
pub enum SessionOp {
    /// Write the session file, then keep the snapshots within `budget` bytes (never `keep`).
    Save {
        record: Box<SessionRecord>,
        budget: u64,
    },
    List,
    /// Read a session; `identity` is the loaded model's (for `OpenWhich::Latest`).
    Open {
        which: OpenWhich,
        identity: String,
    },
    Delete {
        which: String,
    },
}

/// What a `SessionOp` did.
#[derive(Clone, Debug)]
pub enum SessionOutcome {
    /// Saved; the snapshots the budget evicted.
    Saved(Result<Vec<String>, String>),
    Listed(Vec<SessionSummary>, Vec<String>),
    Opened(Result<Box<SessionRecord>, String>),
    Deleted(Result<String, String>),
}

/// The open session and the `/sessions` list.
#[derive(Clone, Debug, Default)]
pub struct SessionsState {
    /// `None`: sessions are not kept (no data directory).
    pub store: Option<Store>,
    /// Disk budget of the snapshots, bytes.
    pub budget: u64,
    pub id: String,
    /// Set by `/rename`; otherwise the first user line.
    pub title: Option<String>,
    pub created: u64,
    /// The transcript the worker reported with the last snapshot.
    pub transcript: Option<TranscriptIds>,
    pub tokens: u32,
    /// A snapshot was asked for and its `SnapshotSaved` has not come back (the exit waits for it,
    /// so the session file carries the last turn's transcript).
    pub snapshot_pending: bool,
    /// `--resume` / `--session`, run once the model is loaded.
    pub pending_open: Option<OpenWhich>,
    /// The `/sessions` overlay and its selected row.
    pub list: Option<Vec<SessionSummary>>,
    pub selected: usize,
}

impl SessionsState {
    pub fn new(store: Option<Store>, budget: u64) -> SessionsState {
        let now = store::now_unix();
        SessionsState {
            store,
            budget,
            id: store::new_id(now),
            created: now,
            ..Default::default()
        }
    }

    fn start_new(&mut self) {
        let now = store::now_unix();
        self.id = store::new_id(now);
        self.created = now;
        self.title = None;
        self.transcript = None;
        self.tokens = 0;
    }
}

fn session_effect(store: &Store, op: SessionOp) -> Effect {
    Effect::Session(store.clone(), op)
}

impl App {
    fn has_turns(&self) -> bool {
        self.items.iter().any(|i| matches!(i, Item::Turn(t) if !t.in_flight()))
    }

    /// The open session as a file.
    pub fn session_record(&self) -> SessionRecord {
        let mut messages = self.conversation(None).messages;
        messages.retain(|m| m.role != Role::System);
        let s = &self.sessions;
        let c = &self.config;
        let model = self.metrics.model.as_ref();
        SessionRecord {
            version: store::SESSION_VERSION,
            id: s.id.clone(),
            title: s.title.clone().unwrap_or_else(|| SessionRecord::title_from(&messages)),
            created: s.created,
            updated: store::now_unix(),
            model: ModelRef {
                name: self.model_label.clone(),
                identity: model.map_or_else(String::new, |m| m.identity.clone()),
            },
            settings: SessionSettings {
                think: settings::think_name(c.think).into(),
                system: c.system.clone(),
                temperature: c.sampling.temperature,
                top_p: c.sampling.top_p,
                top_k: c.sampling.top_k,
                min_p: c.sampling.min_p,
                seed: c.sampling.seed,
                max_tokens: c.max_tokens,
            },
            messages,
            tokens: s.tokens,
            transcript: s.transcript.clone(),
        }
    }

    /// Save effects after a finished turn: the worker writes the snapshot first.
    pub(super) fn after_turn(&mut self, reason: FinishReason) -> Vec<Effect> {
        let Some(store) = &self.sessions.store else {
            return Vec::new();
        };
        if !self.has_turns() && reason == FinishReason::Cancelled {
            return Vec::new();
        }
        self.sessions.snapshot_pending = true;
        vec![Effect::Engine(Command::SaveSnapshot {
            path: store.snapshot_path(&self.sessions.id),
        })]
    }

    /// The worker wrote (or could not write) the snapshot: the session file follows.
    pub(super) fn on_snapshot_saved(
        &mut self,
        result: Result<u64, String>,
        tokens: u32,
        transcript: Option<TranscriptIds>,
    ) -> Vec<Effect> {
        self.sessions.snapshot_pending = false;
        if let Err(e) = result {
            self.status = Some(format!("KV snapshot not saved: {e}"));
        }
        self.sessions.tokens = tokens;
        self.sessions.transcript = transcript;
        self.save_session()
    }

    /// Writes the session file (when there is something to keep).
    pub fn save_session(&mut self) -> Vec<Effect> {
        match &self.sessions.store {
            Some(store) if self.has_turns() => vec![session_effect(
                store,
                SessionOp::Save {
                    record: Box::new(self.session_record()),
                    budget: self.sessions.budget,
                },
            )],
            _ => Vec::new(),
        }
    }

    /// The model is loaded: open what `--resume` / `--session` asked for.
    pub(super) fn after_load(&mut self) -> Vec<Effect> {
        let (Some(which), Some(store), Some(info)) = (
            self.sessions.pending_open.take(),
            &self.sessions.store,
            &self.metrics.model,
        ) else {
            return Vec::new();
        };
        vec![session_effect(
            store,
            SessionOp::Open {
                which,
                identity: info.identity.clone(),
            },
        )]
    }

    pub fn on_session_outcome(&mut self, outcome: SessionOutcome) -> Vec<Effect> {
        match outcome {
            SessionOutcome::Saved(Ok(evicted)) if !evicted.is_empty() => {
                self.status = Some(format!("disk budget: dropped {} old KV snapshot(s)", evicted.len()));
            }
            SessionOutcome::Saved(Ok(_)) => {}
            SessionOutcome::Saved(Err(e)) => self.status = Some(format!("session not saved: {e}")),
            SessionOutcome::Listed(list, problems) => {
                for p in problems {
                    self.note(p, true);
                }
                if list.is_empty() {
                    self.status = Some("no saved sessions".into());
                } else {
                    self.sessions.selected = 0;
                    self.sessions.list = Some(list);
                }
            }
            SessionOutcome::Opened(Ok(rec)) => return self.open_record(*rec),
            SessionOutcome::Opened(Err(e)) => {
                self.note(e, true);
                if self.phase == Phase::Loading && self.metrics.model.is_some() {
                    self.phase = Phase::Idle;
                }
            }
            SessionOutcome::Deleted(Ok(id)) => {
                self.status = Some(format!("deleted session {id}"));
                if id == self.sessions.id {
                    self.sessions.start_new();
                }
            }
            SessionOutcome::Deleted(Err(e)) => self.status = Some(e),
        }
        Vec::new()
    }

    /// Shows a saved session and asks the worker to resume it.
    fn open_record(&mut self, rec: SessionRecord) -> Vec<Effect> {
        let mut effects = Vec::new();
        if self.is_busy() {
            effects.push(Effect::Engine(Command::Cancel));
        }
        let st = &rec.settings;
        if let Ok(t) = settings::parse_think(&st.think) {
            self.config.think = t;
        }
        self.config.system = st.system.clone();
        let sampling = &mut self.config.sampling;
        (sampling.temperature, sampling.top_p, sampling.top_k) = (st.temperature, st.top_p, st.top_k);
        (sampling.min_p, sampling.seed) = (st.min_p, st.seed);
        self.config.max_tokens = st.max_tokens;
        self.items.clear();
        let mut pending: Option<Turn> = None;
        for m in &rec.messages {
            match m.role {
                Role::User => {
                    if let Some(t) = pending.take() {
                        self.push_restored(t);
                    }
                    pending = Some(Turn::new(m.content.clone(), self.config.think));
                }
                Role::Assistant => {
                    let mut t = pending
                        .take()
                        .unwrap_or_else(|| Turn::new(String::new(), self.config.think));
                    t.answer = m.content.clone();
                    t.reasoning = m.reasoning.clone().unwrap_or_default();
                    self.push_restored(t);
                }
                Role::System => {}
            }
        }
        if let Some(t) = pending {
            self.push_restored(t);
        }
        let ours = self
            .metrics
            .model
            .as_ref()
            .is_some_and(|m| m.identity == rec.model.identity);
        if !ours {
            self.note(
                format!(
                    "session saved with {}; its cache is rebuilt for this model",
                    rec.model.name
                ),
                false,
            );
        }
        let snapshot = self.sessions.store.as_ref().map(|s| s.snapshot_path(&rec.id));
        self.sessions.id = rec.id.clone();
        self.sessions.created = rec.created;
        self.sessions.title = Some(rec.title.clone());
        self.sessions.tokens = rec.tokens;
        self.sessions.transcript = rec.transcript.clone();
        self.sessions.list = None;
        self.scroll_top = None;
        self.selected = None;
        self.phase = Phase::Loading;
        self.metrics.loading = Some(format!("resuming session {}", rec.id));
        self.status = Some(format!("session {}: {}", rec.id, rec.title));
        let messages: Vec<Message> = self.conversation(None).messages;
        effects.push(Effect::Engine(Command::SetSampling(self.config.sampling.clone())));
        effects.push(Effect::Engine(Command::Resume(ResumeRequest {
            messages,
            transcript: rec.transcript,
            snapshot,
        })));
        effects
    }

    fn push_restored(&mut self, mut t: Turn) {
        t.id = self.next_turn_id;
        self.next_turn_id += 1;
        t.state = TurnState::Done(FinishReason::Eos);
        self.items.push(Item::Turn(t));
    }

    /// The worker has the conversation's cache.
    pub(super) fn on_resumed(&mut self, tokens: u32, from_snapshot: bool, secs: f64, note: Option<String>) {
        self.metrics.loading = None;
        self.metrics.prefill = None;
        self.metrics.context_used = tokens;
        if let Some(n) = note {
            self.note(n, false);
        }
        let how = if from_snapshot {
            "from its KV snapshot"
        } else {
            "read again"
        };
        self.status = Some(format!("resumed: {tokens} tokens {how} in {secs:.2} s"));
        if self.phase == Phase::Loading {
            self.phase = Phase::Idle;
        }
    }

    fn store_or_status(&mut self, name: &str) -> Option<Store> {
        if self.sessions.store.is_none() {
            self.status = Some(format!("{name}: sessions are not kept (no data directory)"));
        }
        self.sessions.store.clone()
    }

    pub(super) fn sessions_command(&mut self, name: &'static str, _arg: &str) -> Vec<Effect> {
        match self.store_or_status(name) {
            Some(store) => vec![session_effect(&store, SessionOp::List)],
            None => Vec::new(),
        }
    }

    pub(super) fn load_command(&mut self, name: &'static str, arg: &str) -> Vec<Effect> {
        if arg.is_empty() {
            return self.error_status(format!("{name}: give a number from /sessions or an id"));
        }
        if self.is_busy() {
            return self.error_status(format!("{name}: wait for the answer or press Esc"));
        }
        let Some(store) = self.store_or_status(name) else {
            return Vec::new();
        };
        let identity = self
            .metrics
            .model
            .as_ref()
            .map_or_else(String::new, |m| m.identity.clone());
        vec![session_effect(
            &store,
            SessionOp::Open {
                which: OpenWhich::Named(arg.to_string()),
                identity,
            },
        )]
    }

    pub(super) fn new_command(&mut self, _name: &'static str, _arg: &str) -> Vec<Effect> {
        let effects = self.clear();
        self.sessions.start_new();
        self.status = Some(format!("new session {}", self.sessions.id));
        effects
    }

    pub(super) fn delete_command(&mut self, name: &'static str, arg: &str) -> Vec<Effect> {
        if arg.is_empty() {
            return self.error_status(format!("{name}: give a number from /sessions or an id"));
        }
        match self.store_or_status(name) {
            Some(store) => vec![session_effect(&store, SessionOp::Delete { which: arg.into() })],
            None => Vec::new(),
        }
    }

    pub(super) fn rename_command(&mut self, name: &'static str, arg: &str) -> Vec<Effect> {
        if arg.is_empty() {
            return self.error_status(format!("{name}: give the new title"));
        }
        self.sessions.title = Some(arg.to_string());
        self.status = Some(format!("session renamed: {arg}"));
        self.save_session()
    }

    /// A key while the `/sessions` list is open: Up/Down select, Enter opens, Esc closes.
    pub(super) fn sessions_list_key(&mut self, code: crossterm::event::KeyCode) -> Vec<Effect> {
        use crossterm::event::KeyCode as K;
        let Some(list) = &self.sessions.list else {
            return Vec::new();
        };
        let n = list.len();
        match code {
            K::Up => self.sessions.selected = self.sessions.selected.saturating_sub(1),
            K::Down => self.sessions.selected = (self.sessions.selected + 1).min(n.saturating_sub(1)),
            K::Enter => {
                let id = list[self.sessions.selected.min(n - 1)].id.clone();
                self.sessions.list = None;
                return self.load_command("/load", &id);
            }
            _ => self.sessions.list = None,
        }
        Vec::new()
    }
}
