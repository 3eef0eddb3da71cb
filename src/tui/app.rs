//! The app state and its two pure update functions: `App::on_engine_event` (worker events) and
//! `App::on_key` (keys → commands for the worker).
//!
//! Owns the conversation as shown, the live metrics, the input, scrolling and overlays. Must not
//! draw (`ui`, `widgets`), touch the terminal (`terminal`) or block: every engine interaction is a
//! returned `Command`.

use std::collections::VecDeque;
use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseEvent, MouseEventKind};

use super::config::{self, Config};
use super::widgets::input::InputState;
use crate::engine::events::{
    Command, DeviceMemory, Event, FinishReason, LiveStats, LoadRequest, ModelInfo, Residency, TextKind, TurnRequest,
    WarmupPhase,
};
use crate::engine::{metrics, settings};
use crate::model::chat::{Conversation, Message, Role, ThinkMode};

/// Most per-token rates kept for the sparkline.
pub const RATE_HISTORY: usize = 240;

/// Slash commands with their argument hint and help line.
pub const SLASH_COMMANDS: &[(&str, &str, &str)] = &[
    ("/help", "", "show keys and commands"),
    ("/think", "", "reasoning on (high)"),
    ("/nothink", "", "reasoning off"),
    ("/think-max", "", "max reasoning (big ctx)"),
    ("/system", "TEXT", "system prompt (none)"),
    ("/temp", "X", "temperature (0 greedy)"),
    ("/top-p", "X", "nucleus mass (0, 1]"),
    ("/min-p", "X", "min-p cut [0, 1]"),
    ("/seed", "N", "seed (random: none)"),
    ("/ctx", "N", "context size (reload)"),
    ("/clear", "", "forget conversation"),
    ("/retry", "", "regenerate last answer"),
    ("/edit", "", "edit last message"),
    ("/save", "FILE", "save as .json or .md"),
    ("/quit", "", "leave"),
];

/// Where the app is in its life.
#[derive(Clone, Debug, PartialEq)]
pub enum Phase {
    /// Waiting for `Loaded`.
    Loading,
    /// Ready for a prompt.
    Idle,
    /// A turn is in flight (prefill or decode).
    Busy,
    /// Cancel sent, waiting for `TurnFinished`.
    Cancelling,
    /// The model is unusable; only quitting is left.
    Failed(String),
}

/// State of one turn's answer.
#[derive(Clone, Debug, PartialEq)]
pub enum TurnState {
    /// Submitted; the worker has not started it.
    Queued,
    Prefill,
    Streaming,
    Done(FinishReason),
    Failed(String),
}

/// Performance figures of one turn.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TurnStats {
    pub prompt_tokens: u32,
    pub reused_tokens: u32,
    pub prefill_tokens: u32,
    pub prefill_time: Duration,
    pub generated: u32,
    pub decode_time: Duration,
    /// Tokens in the session after the turn.
    pub context_after: Option<u32>,
}

impl TurnStats {
    pub fn decode_tps(&self) -> Option<f64> {
        metrics::tokens_per_second(self.generated as u64, self.decode_time)
    }
}

/// One exchange: a user message and the assistant's reasoning and answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    /// Unique within the app run (keys the render cache).
    pub id: u64,
    pub user: String,
    pub reasoning: String,
    pub answer: String,
    pub think: ThinkMode,
    /// Explicit reasoning visibility (Tab); `None` = automatic (open until the answer starts).
    pub reasoning_open: Option<bool>,
    pub state: TurnState,
    pub stats: TurnStats,
    /// Worker note (e.g. "think max needs ctx >= 393216; using high").
    pub note: Option<String>,
    /// A non-fatal engine error reported during the turn.
    pub error: Option<String>,
}

impl Turn {
    pub fn new(user: String, think: ThinkMode) -> Turn {
        Turn {
            id: 0,
            user,
            reasoning: String::new(),
            answer: String::new(),
            think,
            reasoning_open: None,
            state: TurnState::Queued,
            stats: TurnStats::default(),
            note: None,
            error: None,
        }
    }

    pub fn reasoning_visible(&self) -> bool {
        self.reasoning_open.unwrap_or(self.answer.is_empty())
    }

    pub fn in_flight(&self) -> bool {
        matches!(
            self.state,
            TurnState::Queued | TurnState::Prefill | TurnState::Streaming
        )
    }
}

/// An entry of the chat pane.
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Turn(Turn),
    /// An app message (command result, error) shown between turns.
    Note {
        text: String,
        error: bool,
    },
}

/// Live weight warm-up figures.
#[derive(Clone, Debug, PartialEq)]
pub struct Warmup {
    pub phase: WarmupPhase,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub elapsed: Duration,
    pub finished: bool,
}

impl Warmup {
    pub fn rate_gib_s(&self) -> f64 {
        metrics::transfer_rate(self.done_bytes, self.total_bytes, self.elapsed)
            .0
            .unwrap_or(0.0)
    }

    pub fn eta_secs(&self) -> Option<f64> {
        let (_, left) = metrics::transfer_rate(self.done_bytes, self.total_bytes, self.elapsed);
        left.filter(|_| !self.finished).map(|d| d.as_secs_f64())
    }
}

/// Live prefill progress.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefillLive {
    pub done: u32,
    pub total: u32,
    pub elapsed: Duration,
}

impl PrefillLive {
    pub fn eta_secs(&self) -> Option<f64> {
        metrics::time_left(self.done as u64, self.total as u64, self.elapsed).map(|d| d.as_secs_f64())
    }
}

/// Everything the side panel shows, updated from worker events only.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    pub loading: Option<String>,
    pub model: Option<ModelInfo>,
    pub warmup: Option<Warmup>,
    pub residency: Option<Residency>,
    pub device_memory: Option<DeviceMemory>,
    pub prefill: Option<PrefillLive>,
    /// (tokens, time) of the last finished prefill.
    pub last_prefill: Option<(u32, Duration)>,
    /// Per-token decode rates (t/s), newest last.
    pub rates: VecDeque<f64>,
    /// The last `metrics::DECODE_RATE_WINDOW` step times: the live rate until the worker sends one.
    pub recent: VecDeque<Duration>,
    /// Average decode rate of the last finished turn.
    pub last_turn_tps: Option<f64>,
    pub context_used: u32,
    pub generating: bool,
    /// The worker's latest live snapshot (decode rate, prefill latency, memory).
    pub live: Option<LiveStats>,
}

impl Metrics {
    /// Live decode rate over the last few tokens, or the last turn's average when idle.
    pub fn decode_tps(&self) -> Option<f64> {
        if self.generating
            && let Some(r) = self.live.as_ref().and_then(|l| l.decode_tps_now)
        {
            return Some(r);
        }
        if self.generating
            && let Some(r) = metrics::tokens_per_second(self.recent.len() as u64, self.recent.iter().sum())
        {
            return Some(r);
        }
        self.last_turn_tps
    }
}

/// The whole UI state.
#[derive(Clone, Debug)]
pub struct App {
    pub config: Config,
    /// How the model is loaded (kept for /ctx reloads).
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
    /// Text for the loop to copy through OSC 52.
    pub clipboard: Option<String>,
    next_turn_id: u64,
    /// Rendered lines of finished turns (see `widgets::chat`); a cache, not state.
    pub chat_cache: ChatCache,
}

/// Key of a cached turn rendering: (turn id, width, selected, last item, reasoning shown, theme).
pub type ChatCacheKey = (u64, usize, bool, bool, bool, bool);
pub type ChatCache = std::cell::RefCell<std::collections::HashMap<ChatCacheKey, ChatLines>>;
pub type ChatLines = std::sync::Arc<Vec<ratatui::text::Line<'static>>>;

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
            clipboard: None,
            next_turn_id: 1,
            chat_cache: Default::default(),
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

    /// Applies one worker event.
    pub fn on_engine_event(&mut self, ev: Event) {
        match ev {
            Event::LoadStarted { what } => {
                self.metrics.loading = Some(what);
                // A turn submitted during the load keeps the app busy.
                if self.phase == Phase::Idle {
                    self.phase = Phase::Loading;
                }
            }
            Event::Loaded(info) => {
                self.metrics.loading = None;
                self.metrics.context_used = 0;
                if let Some(r) = &info.fallback_reason {
                    self.note(format!("using the CPU backend: {r}"), false);
                }
                self.metrics.model = Some(info);
                if self.phase == Phase::Loading {
                    self.phase = Phase::Idle;
                }
            }
            Event::WarmupProgress {
                phase,
                done_bytes,
                total_bytes,
                elapsed,
            } => {
                self.metrics.warmup = Some(Warmup {
                    phase,
                    done_bytes,
                    total_bytes,
                    elapsed,
                    finished: false,
                });
            }
            Event::WarmupDone { total_bytes, elapsed } => {
                let phase = self.metrics.warmup.as_ref().map_or(WarmupPhase::PageIn, |w| w.phase);
                self.metrics.warmup = Some(Warmup {
                    phase,
                    done_bytes: total_bytes,
                    total_bytes,
                    elapsed,
                    finished: true,
                });
            }
            Event::Residency(r) => self.metrics.residency = Some(r),
            Event::DeviceMemory(m) => self.metrics.device_memory = Some(m),
            Event::TurnStarted {
                prompt_tokens,
                reused_tokens,
                think,
                note,
            } => {
                self.metrics.prefill = None;
                self.metrics.recent.clear();
                self.metrics.context_used = reused_tokens;
                if let Some(t) = self.current_turn() {
                    t.state = TurnState::Prefill;
                    t.think = think;
                    t.stats.prompt_tokens = prompt_tokens;
                    t.stats.reused_tokens = reused_tokens;
                    t.note = note;
                }
            }
            Event::PrefillProgress { done, total, elapsed } => {
                self.metrics.prefill = Some(PrefillLive { done, total, elapsed });
            }
            Event::PrefillDone { tokens, elapsed } => {
                self.metrics.prefill = None;
                self.metrics.last_prefill = Some((tokens, elapsed));
                if let Some(t) = self.current_turn() {
                    t.stats.prefill_tokens = tokens;
                    t.stats.prefill_time = elapsed;
                    t.state = TurnState::Streaming;
                }
                self.metrics.context_used = self.current_turn_prompt().unwrap_or(self.metrics.context_used);
                self.metrics.generating = true;
            }
            Event::Text { kind, text } => {
                if let Some(t) = self.current_turn() {
                    t.state = TurnState::Streaming;
                    match kind {
                        TextKind::Reasoning => t.reasoning.push_str(&text),
                        TextKind::Answer => t.answer.push_str(&text),
                    }
                }
            }
            Event::TokenTiming { elapsed, .. } => {
                let m = &mut self.metrics;
                m.generating = true;
                m.context_used += 1;
                m.recent.push_back(elapsed);
                while m.recent.len() > metrics::DECODE_RATE_WINDOW {
                    m.recent.pop_front();
                }
                if let Some(rate) = metrics::tokens_per_second(1, elapsed) {
                    m.rates.push_back(rate);
                    while m.rates.len() > RATE_HISTORY {
                        m.rates.pop_front();
                    }
                }
                if let Some(t) = self.current_turn() {
                    t.stats.generated += 1;
                    t.stats.decode_time += elapsed;
                }
            }
            Event::TurnFinished {
                reason,
                generated,
                context_used,
            } => {
                self.metrics.prefill = None;
                self.metrics.generating = false;
                self.metrics.context_used = context_used;
                if let Some(t) = self.current_turn() {
                    t.state = TurnState::Done(reason);
                    t.stats.generated = generated.max(t.stats.generated);
                    t.stats.context_after = Some(context_used);
                    let tps = t.stats.decode_tps();
                    if tps.is_some() {
                        self.metrics.last_turn_tps = tps;
                    }
                }
                if self.is_busy() {
                    if self.phase == Phase::Cancelling {
                        self.status = None;
                    }
                    self.phase = Phase::Idle;
                }
            }
            Event::Notice { message } => self.note(message, false),
            Event::Stats(s) => {
                self.metrics.context_used = s.context_used;
                self.metrics.live = Some(s);
            }
            Event::Error { message, fatal } => {
                if fatal {
                    self.metrics.prefill = None;
                    self.metrics.generating = false;
                    if let Some(t) = self.current_turn() {
                        t.state = TurnState::Failed(message.clone());
                    }
                    self.phase = Phase::Failed(message);
                } else if let Some(t) = self.current_turn() {
                    // The worker still ends the turn with `TurnFinished`.
                    t.error = Some(message);
                } else {
                    self.note(message, true);
                    if self.phase == Phase::Loading {
                        self.phase = Phase::Idle;
                    }
                }
            }
            Event::ShutdownComplete => {}
        }
    }

    fn current_turn_prompt(&mut self) -> Option<u32> {
        self.current_turn().map(|t| t.stats.prompt_tokens)
    }

    /// The conversation to send: system prompt, finished turns, then `next_user` if given.
    pub fn conversation(&self, next_user: Option<&str>) -> Conversation {
        let mut messages = Vec::new();
        if !self.config.system.is_empty() {
            messages.push(Message {
                role: Role::System,
                content: self.config.system.clone(),
                reasoning: None,
            });
        }
        for item in &self.items {
            if let Item::Turn(t) = item {
                if t.in_flight() {
                    continue;
                }
                messages.push(Message {
                    role: Role::User,
                    content: t.user.clone(),
                    reasoning: None,
                });
                messages.push(Message {
                    role: Role::Assistant,
                    content: t.answer.clone(),
                    reasoning: (!t.reasoning.is_empty()).then(|| t.reasoning.clone()),
                });
            }
        }
        if let Some(u) = next_user {
            messages.push(Message {
                role: Role::User,
                content: u.to_string(),
                reasoning: None,
            });
        }
        Conversation { messages }
    }

    fn submit(&mut self, text: String) -> Vec<Command> {
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
        vec![Command::Submit(TurnRequest {
            conversation,
            think: self.config.think,
            sampling: self.config.sampling.clone(),
            max_tokens: self.config.max_tokens,
        })]
    }

    /// Pasted text (bracketed paste) goes into the input box as is, newlines kept.
    pub fn on_paste(&mut self, text: &str) {
        if matches!(self.phase, Phase::Failed(_)) {
            return;
        }
        self.show_help = false;
        self.history_pos = None;
        self.input.insert_str(text);
    }

    pub fn on_resize(&mut self, cols: u16, rows: u16) {
        self.size = (cols, rows);
    }

    pub fn on_mouse(&mut self, m: MouseEvent) {
        match m.kind {
            MouseEventKind::ScrollUp => self.scroll_by(-3),
            MouseEventKind::ScrollDown => self.scroll_by(3),
            _ => {}
        }
    }

    /// Scrolls the chat by `delta` lines (negative = up); reaching the bottom follows the stream again.
    pub fn scroll_by(&mut self, delta: i64) {
        let (total, height) = super::ui::chat_geometry(self);
        let max_top = total.saturating_sub(height);
        let top = self.scroll_top.unwrap_or(max_top) as i64 + delta;
        let top = top.clamp(0, max_top as i64) as usize;
        self.scroll_top = if top >= max_top { None } else { Some(top) };
    }

    fn page(&self) -> i64 {
        let (_, h) = super::ui::chat_geometry(self);
        (h as i64 - 2).max(1)
    }

    /// Handles a key; returns the commands for the worker.
    pub fn on_key(&mut self, key: KeyEvent) -> Vec<Command> {
        if key.kind == KeyEventKind::Release {
            return Vec::new();
        }
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        let alt = key.modifiers.contains(KeyModifiers::ALT);
        let shift = key.modifiers.contains(KeyModifiers::SHIFT);
        let was_armed = std::mem::take(&mut self.quit_armed);
        if !matches!(key.code, KeyCode::Esc) {
            self.status = None;
        }

        if let Phase::Failed(_) = self.phase {
            match key.code {
                KeyCode::Esc | KeyCode::Enter | KeyCode::Char('q') => self.should_quit = true,
                KeyCode::Char('c') if ctrl => self.should_quit = true,
                _ => {}
            }
            return Vec::new();
        }
        if self.show_help {
            if ctrl && key.code == KeyCode::Char('c') {
                self.should_quit = true;
            }
            self.show_help = false;
            return Vec::new();
        }

        match key.code {
            KeyCode::Char('c') if ctrl => {
                if self.is_busy() {
                    return self.cancel();
                }
                self.should_quit = true;
                Vec::new()
            }
            KeyCode::Esc => {
                if self.is_busy() {
                    return self.cancel();
                }
                if was_armed {
                    self.should_quit = true;
                } else {
                    self.quit_armed = true;
                    self.status = Some("press Esc again to quit".into());
                }
                Vec::new()
            }
            KeyCode::F(1) => {
                self.show_help = true;
                Vec::new()
            }
            KeyCode::Char('?') if self.input.is_empty() && !ctrl && !alt => {
                self.show_help = true;
                Vec::new()
            }
            KeyCode::F(2) => {
                self.side_panel = !self.side_panel;
                Vec::new()
            }
            KeyCode::PageUp => {
                self.scroll_by(-self.page());
                Vec::new()
            }
            KeyCode::PageDown => {
                self.scroll_by(self.page());
                Vec::new()
            }
            KeyCode::End if ctrl || self.scroll_top.is_some() || self.input.is_empty() => {
                self.scroll_top = None;
                self.input.end();
                Vec::new()
            }
            KeyCode::Home if ctrl => {
                self.scroll_top = Some(0);
                Vec::new()
            }
            KeyCode::Up if ctrl => {
                self.select_turn(-1);
                Vec::new()
            }
            KeyCode::Down if ctrl => {
                self.select_turn(1);
                Vec::new()
            }
            KeyCode::Tab | KeyCode::BackTab => {
                if self.input.text.starts_with('/') && !self.input.text.contains(' ') {
                    self.complete_slash();
                } else {
                    self.toggle_reasoning();
                }
                Vec::new()
            }
            KeyCode::Char('y') if ctrl => {
                self.copy_last_answer();
                Vec::new()
            }
            KeyCode::Char('l') if ctrl => self.clear(),
            KeyCode::Char('j') if ctrl => {
                self.input.insert_char('\n');
                Vec::new()
            }
            KeyCode::Enter if alt || shift || ctrl => {
                self.input.insert_char('\n');
                Vec::new()
            }
            KeyCode::Enter => self.enter(),
            KeyCode::Up if self.input.is_empty() || self.history_pos.is_some() => {
                self.recall(-1);
                Vec::new()
            }
            KeyCode::Down if self.history_pos.is_some() => {
                self.recall(1);
                Vec::new()
            }
            KeyCode::Up => {
                self.input.up();
                Vec::new()
            }
            KeyCode::Down => {
                self.input.down();
                Vec::new()
            }
            code => {
                self.history_pos = None;
                match code {
                    KeyCode::Char('u') if ctrl => self.input.delete_to_line_start(),
                    KeyCode::Char('w') if ctrl => self.input.delete_word(),
                    KeyCode::Char('a') if ctrl => self.input.home(),
                    KeyCode::Char('e') if ctrl => self.input.end(),
                    KeyCode::Char(c) if !ctrl => self.input.insert_char(c),
                    KeyCode::Backspace => self.input.backspace(),
                    KeyCode::Delete => self.input.delete(),
                    KeyCode::Left => self.input.left(),
                    KeyCode::Right => self.input.right(),
                    KeyCode::Home => self.input.home(),
                    KeyCode::End => self.input.end(),
                    _ => {}
                }
                Vec::new()
            }
        }
    }

    fn cancel(&mut self) -> Vec<Command> {
        self.phase = Phase::Cancelling;
        self.status = Some("cancelling…".into());
        vec![Command::Cancel]
    }

    fn select_turn(&mut self, dir: i64) {
        let turns: Vec<usize> = (0..self.items.len())
            .filter(|&i| matches!(self.items[i], Item::Turn(_)))
            .collect();
        if turns.is_empty() {
            return;
        }
        let cur = self
            .selected
            .and_then(|s| turns.iter().position(|&i| i == s))
            .unwrap_or(turns.len() - 1) as i64;
        let next = (cur + dir).clamp(0, turns.len() as i64 - 1) as usize;
        self.selected = Some(turns[next]);
    }

    /// The turn Tab acts on: the selected one, else the newest.
    pub fn selected_turn(&self) -> Option<usize> {
        self.selected.or_else(|| self.last_turn_index())
    }

    fn toggle_reasoning(&mut self) {
        if let Some(i) = self.selected_turn()
            && let Item::Turn(t) = &mut self.items[i]
        {
            if t.reasoning.is_empty() {
                self.status = Some("this turn has no reasoning".into());
                return;
            }
            t.reasoning_open = Some(!t.reasoning_visible());
        }
    }

    fn copy_last_answer(&mut self) {
        let answer = self.items.iter().rev().find_map(|i| match i {
            Item::Turn(t) if !t.answer.is_empty() => Some(t.answer.clone()),
            _ => None,
        });
        match answer {
            Some(a) => {
                self.status = Some(format!("copied {} characters (OSC 52)", a.chars().count()));
                self.clipboard = Some(a);
            }
            None => self.status = Some("no answer to copy yet".into()),
        }
    }

    fn clear(&mut self) -> Vec<Command> {
        let mut cmds = Vec::new();
        if self.is_busy() {
            cmds.push(Command::Cancel);
        }
        self.items.clear();
        self.scroll_top = None;
        self.selected = None;
        self.metrics.context_used = 0;
        if !matches!(self.phase, Phase::Loading) {
            self.phase = Phase::Idle;
        }
        self.status = Some("conversation cleared".into());
        cmds.push(Command::Reset);
        cmds
    }

    fn recall(&mut self, dir: i64) {
        if self.history.is_empty() {
            return;
        }
        let n = self.history.len() as i64;
        let pos = match self.history_pos {
            None if dir < 0 => n - 1,
            None => return,
            Some(p) => p as i64 + dir,
        };
        if pos >= n {
            self.history_pos = None;
            self.input.set("");
            return;
        }
        let pos = pos.clamp(0, n - 1) as usize;
        self.history_pos = Some(pos);
        let text = self.history[pos].clone();
        self.input.set(&text);
    }

    /// Slash commands matching what is typed (for completion hints).
    pub fn slash_matches(&self) -> Vec<&'static (&'static str, &'static str, &'static str)> {
        let t = self.input.text.as_str();
        if !t.starts_with('/') || t.contains(char::is_whitespace) {
            return Vec::new();
        }
        SLASH_COMMANDS
            .iter()
            .filter(|(name, _, _)| name.starts_with(t))
            .collect()
    }

    fn complete_slash(&mut self) {
        let m = self.slash_matches();
        if let Some(first) = m.first() {
            let common = m.iter().fold(first.0.to_string(), |acc, (n, _, _)| {
                acc.chars()
                    .zip(n.chars())
                    .take_while(|(a, b)| a == b)
                    .map(|(a, _)| a)
                    .collect()
            });
            let text = if m.len() == 1 {
                format!("{}{}", first.0, if first.1.is_empty() { "" } else { " " })
            } else {
                common
            };
            self.input.set(&text);
        }
    }

    fn enter(&mut self) -> Vec<Command> {
        let text = self.input.text.trim_end().to_string();
        if text.trim().is_empty() {
            return Vec::new();
        }
        if text.starts_with('/') {
            self.input.take();
            self.history.push(text.clone());
            self.history_pos = None;
            return self.slash(&text);
        }
        match self.phase {
            // While loading the turn is queued behind `Load` in the worker's command channel.
            Phase::Busy | Phase::Cancelling => {
                self.status = Some("generating — Esc cancels".into());
                Vec::new()
            }
            _ => {
                self.input.take();
                self.history.push(text.clone());
                self.history_pos = None;
                self.submit(text)
            }
        }
    }

    /// Runs a slash command line.
    pub fn slash(&mut self, line: &str) -> Vec<Command> {
        let (cmd, arg) = match line.split_once(char::is_whitespace) {
            Some((c, a)) => (c, a.trim()),
            None => (line, ""),
        };
        let busy = self.is_busy();
        let needs_idle = matches!(cmd, "/retry" | "/edit" | "/ctx");
        if busy && needs_idle {
            self.status = Some(format!("{cmd}: wait for the answer or press Esc"));
            return Vec::new();
        }
        let sampling_changed = |app: &mut App, what: String| {
            app.status = Some(what);
            vec![Command::SetSampling(app.config.sampling.clone())]
        };
        match cmd {
            "/help" => {
                self.show_help = true;
                Vec::new()
            }
            "/quit" | "/exit" | "/q" => {
                self.should_quit = true;
                Vec::new()
            }
            "/think" => self.set_think(ThinkMode::High),
            "/nothink" => self.set_think(ThinkMode::Off),
            "/think-max" => self.set_think(ThinkMode::Max),
            "/system" => {
                if arg.is_empty() {
                    let cur = if self.config.system.is_empty() {
                        "(none)".to_string()
                    } else {
                        self.config.system.clone()
                    };
                    self.note(format!("system prompt: {cur}"), false);
                } else if arg == "none" {
                    self.config.system.clear();
                    self.status = Some("system prompt cleared".into());
                } else {
                    self.config.system = arg.to_string();
                    self.status = Some("system prompt set".into());
                }
                Vec::new()
            }
            "/temp" | "/top-p" | "/min-p" => {
                let res = match cmd {
                    "/temp" => settings::parse_temp(arg).map(|x| self.config.sampling.temperature = x),
                    "/top-p" => settings::parse_top_p(arg).map(|x| self.config.sampling.top_p = x),
                    _ => settings::parse_min_p(arg).map(|x| self.config.sampling.min_p = x),
                };
                match res {
                    Ok(()) => sampling_changed(self, format!("{cmd} {arg}")),
                    Err(e) => self.error_status(format!("{cmd}: {e}")),
                }
            }
            "/seed" => {
                if arg.is_empty() || arg == "random" {
                    self.config.sampling.seed = None;
                    return sampling_changed(self, "seed: random".into());
                }
                match settings::parse_seed(arg) {
                    Ok(s) => {
                        self.config.sampling.seed = Some(s);
                        sampling_changed(self, format!("seed {s}"))
                    }
                    Err(e) => self.error_status(format!("/seed: {e}")),
                }
            }
            "/ctx" => match settings::parse_app_ctx(arg) {
                Ok(ctx) => {
                    self.config.ctx = ctx;
                    let mut cmds = self.clear();
                    if let Some(mut load) = self.load.clone() {
                        load.ctx = ctx;
                        self.load = Some(load.clone());
                        self.phase = Phase::Loading;
                        cmds.push(Command::Load(load));
                    }
                    self.status = Some(format!("context {ctx}: reloading, conversation cleared"));
                    cmds
                }
                Err(e) => self.error_status(format!("/ctx: {e}")),
            },
            "/clear" => self.clear(),
            "/retry" => self.retry(),
            "/edit" => self.edit(),
            "/save" => {
                if arg.is_empty() {
                    return self.error_status("/save: give a file name (.json or .md)".into());
                }
                match self.save(std::path::Path::new(arg)) {
                    Ok(()) => self.status = Some(format!("saved {arg}")),
                    Err(e) => {
                        self.error_status(e);
                    }
                }
                Vec::new()
            }
            _ => self.error_status(format!("unknown command {cmd} (/help lists them)")),
        }
    }

    fn error_status(&mut self, msg: String) -> Vec<Command> {
        self.status = Some(msg);
        Vec::new()
    }

    fn set_think(&mut self, t: ThinkMode) -> Vec<Command> {
        self.config.think = t;
        let mut msg = format!("thinking: {}", config::think_name(t));
        if t == ThinkMode::Max && self.config.ctx < 393_216 {
            msg.push_str(" (needs ctx >= 393216; the engine will use high)");
        }
        self.status = Some(msg);
        Vec::new()
    }

    /// Session tokens after the turn before `idx` (what a rewind keeps).
    fn tokens_before(&self, idx: usize) -> u32 {
        self.items[..idx]
            .iter()
            .rev()
            .find_map(|i| match i {
                Item::Turn(t) => Some(t.stats.context_after.unwrap_or(0)),
                _ => None,
            })
            .unwrap_or(0)
    }

    fn retry(&mut self) -> Vec<Command> {
        let Some(idx) = self.last_turn_index() else {
            return self.error_status("/retry: nothing to regenerate".into());
        };
        let keep = self.tokens_before(idx);
        let Item::Turn(t) = self.items.remove(idx) else {
            unreachable!()
        };
        self.items.truncate(idx);
        let mut cmds = vec![Command::Rewind { keep_tokens: keep }];
        cmds.extend(self.submit(t.user));
        cmds
    }

    fn edit(&mut self) -> Vec<Command> {
        let Some(idx) = self.last_turn_index() else {
            return self.error_status("/edit: no message to edit".into());
        };
        let keep = self.tokens_before(idx);
        let Item::Turn(t) = self.items.remove(idx) else {
            unreachable!()
        };
        self.items.truncate(idx);
        self.input.set(&t.user);
        self.metrics.context_used = keep;
        self.status = Some("editing the last message; Enter resends".into());
        vec![Command::Rewind { keep_tokens: keep }]
    }

    /// Writes the conversation as markdown (`.md`) or JSON (anything else).
    pub fn save(&self, path: &std::path::Path) -> Result<(), String> {
        let conv = self.conversation(None);
        let is_md = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("md") || e.eq_ignore_ascii_case("markdown"));
        let text = if is_md {
            conversation_markdown(&conv)
        } else {
            serde_json::to_string_pretty(&conv).map_err(|e| format!("/save: {e}"))? + "\n"
        };
        std::fs::write(path, text).map_err(|e| format!("/save {}: {e}", path.display()))
    }
}

/// A conversation as a markdown document.
pub fn conversation_markdown(conv: &Conversation) -> String {
    let mut s = String::from("# ds4-chat conversation\n");
    for m in &conv.messages {
        let who = match m.role {
            Role::System => "System",
            Role::User => "User",
            Role::Assistant => "Assistant",
        };
        s.push_str(&format!("\n## {who}\n\n"));
        if let Some(r) = &m.reasoning {
            for l in r.lines() {
                s.push_str(&format!("> {l}\n"));
            }
            s.push('\n');
        }
        s.push_str(m.content.trim_end());
        s.push('\n');
    }
    s
}
