//! Runs one chat turn on the engine worker for a request: submits it, hands the streamed text to
//! the request's sink (or keeps the whole reply, `run_collected`, for a non-streaming request),
//! cancels when the client hangs up, and collects the figures the API reports (usage with the
//! cached prompt tokens, and timings).
//!
//! The caller holds the generation slot (queue.rs), so it alone reads the worker's events while the
//! turn runs. Owns the event-to-API mapping of one turn. Must not write HTTP.

use std::sync::MutexGuard;
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use crate::engine::events::{Command, Event, FinishReason, TextKind, TurnRequest};
use crate::engine::worker::Worker;

use super::calls::ReplyShaper;
use super::disconnect::HangupWatch;
use super::error::ApiError;
use super::queue::Slot;
use super::server::Server;

/// How often a waiting turn checks whether its client hung up (well under one decode step of the
/// real model).
const HANGUP_POLL: Duration = Duration::from_millis(10);

/// Where a turn's output goes (the SSE stream, or a buffer for a whole response).
pub trait TurnSink {
    /// The prompt is accepted; false when the client is gone.
    fn started(&mut self) -> bool;
    /// A piece of text; false when the client is gone (or the sink wants the turn to stop).
    fn text(&mut self, kind: TextKind, text: &str) -> bool;
    /// The prompt is evaluated: its token counts (the completion count is still 0).
    fn prefilled(&mut self, usage: &Usage) {
        let _ = usage;
    }
}

/// A non-streaming turn's reply, kept whole; it stops the turn at a stop sequence
/// (`ReplyShaper::with_stops`).
struct Collected(ReplyShaper);

impl TurnSink for Collected {
    fn started(&mut self) -> bool {
        true
    }
    fn text(&mut self, kind: TextKind, text: &str) -> bool {
        self.0.push(kind, text);
        self.0.stopped.is_none()
    }
}

/// A non-streaming turn run to its end on `worker`, the holder of `slot` (both released as soon as
/// the engine is done): the whole reply, finished and noted on `server` (`Server::record`), with
/// `watch` stopped. `Ok(None)` when the client hung up (a stop sequence ending the turn is not a
/// hang-up); an engine error is a 500.
pub fn run_collected(
    server: &Server,
    (worker, slot): (MutexGuard<'_, Worker>, Slot<'_>),
    turn: TurnRequest,
    shaper: ReplyShaper,
    watch: HangupWatch,
) -> Result<Option<(TurnOutcome, ReplyShaper)>, ApiError> {
    let thinking = turn.think.thinking();
    let mut collected = Collected(shaper);
    let gone = || watch.gone();
    let outcome = run_turn(&worker, turn, &mut collected, &gone);
    drop(worker);
    drop(slot);
    let mut outcome = outcome?;
    let mut shaper = collected.0;
    outcome.client_gone &= shaper.stopped.is_none();
    shaper.finish();
    server.record(&outcome, &shaper, thinking);
    watch.stop();
    if outcome.client_gone {
        return Ok(None);
    }
    if let Some(e) = outcome.error.take() {
        return Err(ApiError::status(500, e));
    }
    Ok(Some((outcome, shaper)))
}

/// Token counts of a finished turn (OpenAI `usage`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: u32,
    /// Prompt tokens the live cache already held (not evaluated again).
    pub cached_tokens: u32,
    pub completion_tokens: u32,
}

/// Prefill and decode figures of a finished turn (llama-server's `timings` names).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timings {
    /// Prompt tokens evaluated and how long that took.
    pub prompt_n: u32,
    pub prompt_ms: f64,
    /// Tokens generated and the summed time of their decode steps.
    pub predicted_n: u32,
    pub predicted_ms: f64,
    /// Tokens drafted and drafts accepted (llama-server's `draft_n`, `draft_n_accepted`); `None`
    /// when the turn did not decode speculatively.
    pub draft: Option<(u32, u32)>,
}

impl Timings {
    pub fn prompt_per_second(&self) -> f64 {
        per_second(self.prompt_n, self.prompt_ms)
    }
    pub fn predicted_per_second(&self) -> f64 {
        per_second(self.predicted_n, self.predicted_ms)
    }
}

fn per_second(n: u32, ms: f64) -> f64 {
    if n == 0 || ms <= 0.0 {
        0.0
    } else {
        n as f64 * 1000.0 / ms
    }
}

/// How a turn that started ended.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnOutcome {
    pub finish: FinishReason,
    pub usage: Usage,
    pub timings: Timings,
    /// An engine error after the turn started (the text so far was still produced).
    pub error: Option<String>,
    /// The client hung up and the turn was cancelled.
    pub client_gone: bool,
}

/// Run `req` on `worker`. Errors before the turn started (context overflow, no model) are API
/// errors; once started, the outcome says how it ended.
pub fn run_turn(
    worker: &Worker,
    req: TurnRequest,
    sink: &mut dyn TurnSink,
    client_gone: &dyn Fn() -> bool,
) -> Result<TurnOutcome, ApiError> {
    // Events of earlier turns or of the residency sampler that nobody read (notices are logged).
    while let Some(e) = worker.try_recv() {
        log_notice(&e);
    }
    if !worker.send(Command::Submit(req)) {
        return Err(ApiError::status(503, "the engine worker has stopped"));
    }
    let mut started = false;
    let mut cancelled = false;
    let mut error: Option<String> = None;
    let mut usage = Usage::default();
    let mut timings = Timings::default();
    let finish = loop {
        let event = match worker.events().recv_timeout(HANGUP_POLL) {
            Ok(e) => e,
            Err(RecvTimeoutError::Timeout) => {
                if !cancelled && client_gone() {
                    cancelled = worker.send(Command::Cancel);
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return Err(ApiError::status(503, "the engine worker has stopped")),
        };
        match event {
            Event::TurnStarted { prompt_tokens, .. } => {
                started = true;
                usage.prompt_tokens = prompt_tokens;
                if !cancelled && (!sink.started() || client_gone()) {
                    cancelled = worker.send(Command::Cancel);
                }
            }
            Event::PrefillDone { tokens, elapsed } => {
                usage.cached_tokens = usage.prompt_tokens.saturating_sub(tokens);
                timings.prompt_n = tokens;
                timings.prompt_ms = elapsed.as_secs_f64() * 1000.0;
                sink.prefilled(&usage);
            }
            Event::Text { kind, text } => {
                // Once cancelled, the rest of the text has nowhere to go.
                let delivered = cancelled || (sink.text(kind, &text) && !client_gone());
                cancelled |= !delivered && worker.send(Command::Cancel);
            }
            Event::TokenTiming { elapsed, .. } => timings.predicted_ms += elapsed.as_secs_f64() * 1000.0,
            Event::Speculation(f) => timings.draft = Some((f.drafted as u32, f.accepted as u32)),
            Event::Error { message, .. } => error = Some(message),
            Event::Notice { .. } => log_notice(&event),
            Event::TurnFinished { reason, generated, .. } => {
                usage.completion_tokens = generated;
                timings.predicted_n = generated;
                break reason;
            }
            _ => {}
        }
    };
    if !started {
        let message = error.unwrap_or_else(|| "the turn did not start".into());
        return Err(match finish {
            FinishReason::ContextFull => ApiError::field("messages", message).with_code("context_length_exceeded"),
            _ if message == "no model loaded" => ApiError::status(503, message),
            _ if cancelled => ApiError::status(499, "client closed the request"),
            _ => ApiError::status(500, message),
        });
    }
    Ok(TurnOutcome {
        finish,
        usage,
        timings,
        error,
        client_gone: cancelled,
    })
}

/// The worker's notices (the prompt cache's skipped files, …) go to the server's log.
fn log_notice(event: &Event) {
    if let Event::Notice { message } = event {
        eprintln!("ds4-chat serve: {message}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_zero_without_tokens_or_time() {
        let t = Timings {
            prompt_n: 50,
            prompt_ms: 100.0,
            predicted_n: 0,
            predicted_ms: 0.0,
            draft: None,
        };
        assert_eq!(t.prompt_per_second(), 500.0);
        assert_eq!(t.predicted_per_second(), 0.0);
    }
}
