//! What the app shows, as plain data: the phase of its life, the turns and notes of the chat, and the
//! figures of the side panel (warm-up, prefill, decode rates).
//!
//! Owns the data types only; they change in `App`'s update functions (`engine_events`, `keys`,
//! `commands`), never while drawing.

use std::collections::VecDeque;
use std::time::Duration;

use crate::engine::events::{DeviceMemory, FinishReason, LiveStats, ModelInfo, Residency, ServerReport, WarmupPhase};
use crate::engine::metrics;
use crate::model::chat::ThinkMode;

/// Most per-token rates kept for the sparkline.
pub const RATE_HISTORY: usize = 240;

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
    /// What a remote server reported about its last turn (usage, timings).
    pub server: Option<ServerReport>,
    /// Speculative decoding's figures of the last turn that used it (docs/speculative.md#figures).
    pub speculation: Option<crate::engine::generate::SpeculationFigures>,
}

impl Metrics {
    /// The endpoint when the answers come from a server (`--remote`).
    pub fn endpoint(&self) -> Option<&str> {
        self.model.as_ref().and_then(|m| m.endpoint.as_deref())
    }

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
