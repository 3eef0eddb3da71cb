//! The app: its state (`App`, with the data types of `state`) and `App::update`, the one function
//! the run loop feeds every event to. Updates do no I/O: they change the state and return `Effect`s
//! (engine commands, a file to write, text to copy) for the run loop to perform.
//!
//! Owns the conversation as shown, the live metrics, the input, scrolling, overlays and the chat's
//! wrapped-line cache (refreshed here after each change, read by the render). Must not draw (`ui`,
//! `widgets`), touch the terminal or files, or block. What keys do is `keys`, slash commands are
//! `commands`, worker events are `engine_events`, the saved file formats are `transcript`, kept
//! conversations are `sessions`.

pub mod commands;
mod engine_events;
pub mod keys;
pub mod sessions;
pub mod state;
pub mod transcript;

use std::path::Path;
use std::time::Duration;

pub use state::{Item, Metrics, Phase, PrefillLive, RATE_HISTORY, Turn, TurnState, TurnStats, Warmup};

use super::config::Config;
use super::effect::Effect;
use super::event::AppEvent;
use super::widgets::chat::ChatCache;
use super::widgets::input::InputState;
use crate::engine::events::{Command, LoadRequest, TurnRequest};
use crate::model::chat::{Conversation, Message};

/// The whole UI state.
#[derive(Clone, Debug)]
pub struct App {
    pub config: Config,
    /// How the model is loaded (kept for /ctx, which opens a new session on the same engine).
    pub load: Option<LoadRequest>,
    /// What the model is called in the UI (file name or "demo").
    pub model_label: String,
    pub phase: Phase,
    pub items: Vec<Item>,
    pub input: InputState,
    pub history: Vec<String>,
    pub history_pos: Option<usize>,
    /// First chat line shown; `None` follows the stream.
    pub scroll_top: Option<usize>,
    /// Turn (index into `items`) that Tab acts on; `None` = the newest.
    pub selected: Option<usize>,
    pub show_help: bool,
    pub side_panel: bool,
    /// Terminal size (columns, rows).
    pub size: (u16, u16),
    pub metrics: Metrics,
    /// One-line transient message in the status bar.
    pub status: Option<String>,
    pub quit_armed: bool,
    pub should_quit: bool,
    next_turn_id: u64,
    /// Wrapped lines of finished turns at the chat's width (see `widgets::chat`).
    pub chat_cache: ChatCache,
    /// The kept conversation this chat is (`sessions`).
    pub sessions: sessions::SessionsState,
}

impl App {
    pub fn new(config: Config, model_label: String, load: Option<LoadRequest>) -> App {
        App {
            side_panel: config.side_panel,
            config,
            load,
            model_label,
            phase: Phase::Loading,
            items: Vec::new(),
            input: InputState::default(),
            history: Vec::new(),
            history_pos: None,
            scroll_top: None,
            selected: None,
            show_help: false,
            size: (80, 24),
            metrics: Metrics::default(),
            status: None,
            quit_armed: false,
            should_quit: false,
            next_turn_id: 1,
            chat_cache: Default::default(),
            sessions: Default::default(),
        }
    }

    /// An app that cannot work (bad config, model load failure); shows `message` and lets the user quit.
    pub fn failed(config: Config, model_label: String, message: String) -> App {
        let mut app = App::new(config, model_label, None);
        app.phase = Phase::Failed(message);
        app
    }

    pub fn is_busy(&self) -> bool {
        matches!(self.phase, Phase::Busy | Phase::Cancelling)
    }

    fn current_turn(&mut self) -> Option<&mut Turn> {
        self.items.iter_mut().rev().find_map(|i| match i {
            Item::Turn(t) if t.in_flight() => Some(t),
            _ => None,
        })
    }

    fn last_turn_index(&self) -> Option<usize> {
        self.items.iter().rposition(|i| matches!(i, Item::Turn(_)))
    }

    pub fn note(&mut self, text: impl Into<String>, error: bool) {
        self.items.push(Item::Note {
            text: text.into(),
            error,
        });
    }

    /// Applies one event; returns what the run loop must do.
    pub fn update(&mut self, ev: AppEvent) -> Vec<Effect> {
        match ev {
            AppEvent::Key(k) => return self.on_key(k),
            AppEvent::Paste(s) => self.on_paste(&s),
            AppEvent::Mouse(m) => self.on_mouse(m),
            AppEvent::Resize(c, r) => self.on_resize(c, r),
            AppEvent::Engine(e) => return self.on_engine_event(e),
            AppEvent::Session(outcome) => return self.on_session_outcome(outcome),
            AppEvent::EngineGone => self.engine_stopped(),
            AppEvent::TranscriptSaved { path, result } => self.on_transcript_saved(&path, result),
            AppEvent::Signal(_) => self.should_quit = true,
        }
        Vec::new()
    }

    /// The worker is gone (its channel closed or a command could not be sent).
    fn engine_stopped(&mut self) {
        if !self.should_quit && !matches!(self.phase, Phase::Failed(_)) {
            self.phase = Phase::Failed("the engine worker has stopped".into());
        }
    }

    fn on_transcript_saved(&mut self, path: &Path, result: Result<(), String>) {
        self.status = Some(match result {
            Ok(()) => format!("saved {}", path.display()),
            Err(e) => format!("cannot save {}: {e}", path.display()),
        });
    }

    pub fn on_resize(&mut self, cols: u16, rows: u16) {
        self.size = (cols, rows);
        self.refresh_chat_cache();
    }

    /// Brings the wrapped-line cache of finished turns up to date with the items and the chat's
    /// width, so that drawing only reads it.
    pub fn refresh_chat_cache(&mut self) {
        let Some(width) = super::ui::chat_width(self) else {
            return;
        };
        let mut cache = std::mem::take(&mut self.chat_cache);
        super::widgets::chat::refresh_cache(&mut cache, self, width);
        self.chat_cache = cache;
    }

    fn error_status(&mut self, msg: String) -> Vec<Effect> {
        self.status = Some(msg);
        Vec::new()
    }

    /// The conversation to send: system prompt, finished turns, then `next_user` if given.
    pub fn conversation(&self, next_user: Option<&str>) -> Conversation {
        self.messages(next_user, false)
    }

    /// The conversation as `/save` writes it: the turn in flight too, as far as it got.
    pub fn conversation_for_export(&self) -> Conversation {
        self.messages(None, true)
    }

    fn messages(&self, next_user: Option<&str>, in_flight_too: bool) -> Conversation {
        let mut messages = Vec::new();
        if !self.config.system.is_empty() {
            messages.push(Message::system(self.config.system.clone()));
        }
        for item in &self.items {
            if let Item::Turn(t) = item {
                if t.in_flight() && !in_flight_too {
                    continue;
                }
                messages.push(Message::user(t.user.clone()));
                messages.push(Message::assistant(
                    t.answer.clone(),
                    (!t.reasoning.is_empty()).then(|| t.reasoning.clone()),
                ));
            }
        }
        if let Some(u) = next_user {
            messages.push(Message::user(u.to_string()));
        }
        Conversation {
            messages,
            ..Conversation::default()
        }
    }

    fn submit(&mut self, text: String) -> Vec<Effect> {
        let conversation = self.conversation(Some(&text));
        let mut turn = Turn::new(text, self.config.think);
        turn.id = self.next_turn_id;
        self.next_turn_id += 1;
        self.items.push(Item::Turn(turn));
        self.phase = Phase::Busy;
        self.scroll_top = None;
        self.selected = None;
        self.metrics.prefill = Some(PrefillLive {
            done: 0,
            total: 0,
            elapsed: Duration::ZERO,
        });
        vec![Effect::Engine(Command::Submit(TurnRequest {
            conversation,
            think: self.config.think,
            sampling: self.config.sampling.clone(),
            max_tokens: self.config.max_tokens,
        }))]
    }

    /// Forgets the conversation (Ctrl+L, /clear, /ctx).
    fn clear(&mut self) -> Vec<Effect> {
        let mut effects = Vec::new();
        if self.is_busy() {
            effects.push(Effect::Engine(Command::Cancel));
        }
        self.items.clear();
        self.scroll_top = None;
        self.selected = None;
        self.metrics.context_used = 0;
        if !matches!(self.phase, Phase::Loading) {
            self.phase = Phase::Idle;
        }
        self.status = Some("conversation cleared".into());
        effects.push(Effect::Engine(Command::Reset));
        effects
    }

    /// Scrolls the chat by `delta` lines (negative = up); reaching the bottom follows the stream again.
    pub fn scroll_by(&mut self, delta: i64) {
        let (total, height) = super::ui::chat_geometry(self);
        let max_top = total.saturating_sub(height);
        let top = self.scroll_top.unwrap_or(max_top) as i64 + delta;
        let top = top.clamp(0, max_top as i64) as usize;
        self.scroll_top = if top >= max_top { None } else { Some(top) };
    }

    /// The turn Tab acts on: the selected one, else the newest.
    pub fn selected_turn(&self) -> Option<usize> {
        self.selected.or_else(|| self.last_turn_index())
    }
}
