//! How worker events change the app: load and warm-up progress, turn progress and streamed text,
//! per-token timings, errors.
//!
//! Owns `App::on_engine_event`; it updates state, and returns the effects that keep the session
//! (`sessions`): a snapshot after each turn, the session file after the snapshot, `--resume`
//! once the model is loaded.

use super::state::{PrefillLive, RATE_HISTORY, TurnState, Warmup};
use super::{App, Phase};
use crate::engine::events::{Event, TextKind, WarmupPhase};
use crate::engine::metrics;
use crate::tui::effect::Effect;

impl App {
    /// Applies one worker event.
    pub fn on_engine_event(&mut self, ev: Event) -> Vec<Effect> {
        let effects = self.apply_engine_event(ev);
        self.refresh_chat_cache();
        effects
    }

    fn apply_engine_event(&mut self, ev: Event) -> Vec<Effect> {
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
                return self.after_load();
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
                return self.after_turn(reason);
            }
            Event::Notice { message } => self.note(message, false),
            Event::Server(r) => self.metrics.server = Some(r),
            Event::Speculation(f) => self.metrics.speculation = Some(f),
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
            Event::SnapshotSaved {
                result,
                tokens,
                transcript,
                ..
            } => return self.on_snapshot_saved(result, tokens, transcript),
            Event::Resumed {
                tokens,
                from_snapshot,
                elapsed,
                note,
            } => self.on_resumed(tokens, from_snapshot, elapsed.as_secs_f64(), note),
            Event::ShutdownComplete => {}
        }
        Vec::new()
    }

    fn current_turn_prompt(&mut self) -> Option<u32> {
        self.current_turn().map(|t| t.stats.prompt_tokens)
    }
}
