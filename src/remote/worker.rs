//! The remote worker: the engine worker's command loop (`engine::worker`) with an OpenAI-compatible
//! server in place of the engine. It answers `Load` by checking the endpoint and its model list,
//! `Submit` by streaming a chat completion, `Cancel` by dropping the stream, and reports with the
//! engine's events, so the TUI needs no second code path.
//!
//! Guarantees, as the engine worker's: every `Submit` ends in exactly one `TurnFinished`; a failure
//! is an `Error { fatal: false }` naming the cause and the worker keeps serving; `Cancel` ends the
//! turn at once (the stream's thread closes the connection at its next read). The server holds the
//! conversation state, not this worker: each turn sends the whole conversation, so `Reset` and
//! `Rewind` change nothing here.
//!
//! The figures: time to first token and decode tokens/s come from the stream (one chunk per token
//! on the servers named above, unless speculative decoding batches several), through the engine's
//! `TurnTimeline`; the server's own `usage` and `timings` arrive as `Event::Server`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::{Duration, Instant};

use super::client::Client;
use super::stream::{self, StreamMsg};
use super::target::RemoteTarget;
use super::think::ThinkSplitter;
use crate::backend::MemoryReport;
use crate::engine::events::{Command, Event, FinishReason, LiveStats, ModelInfo, ServerReport, TextKind, TurnRequest};
use crate::engine::metrics::TurnTimeline;
use crate::engine::worker::Worker;
use crate::model::chat::{THINK_MAX_MIN_CTX, ThinkMode};

/// How often a turn in flight looks at the command channel (the latency of Esc).
const POLL: Duration = Duration::from_millis(20);
/// Least time between two live stats while streaming.
const STATS_PERIOD: Duration = Duration::from_millis(250);

/// Starts a worker that answers from `target`; it checks the endpoint at once.
pub fn spawn(target: RemoteTarget) -> Worker {
    Worker::spawn_with(move |commands, events| RemoteWorker::new(target, commands, events).run())
}

struct RemoteWorker {
    client: Arc<Client>,
    rx: Receiver<Command>,
    tx: Sender<Event>,
    /// Commands that arrived during a turn and wait for it to end.
    pending: VecDeque<Command>,
    /// The model answering: the one asked for, else the first the server lists.
    model: Option<String>,
    /// The server's context for it (0: not said).
    ctx: u32,
    /// Tokens of the conversation as the server last counted them (its usage), else an estimate.
    context_used: u32,
}

/// What a poll of the command channel during a turn decided.
#[derive(PartialEq)]
enum Interrupt {
    None,
    Stop,
}

impl RemoteWorker {
    fn new(target: RemoteTarget, rx: Receiver<Command>, tx: Sender<Event>) -> RemoteWorker {
        RemoteWorker {
            model: target.model.clone(),
            client: Arc::new(Client::new(target)),
            rx,
            tx,
            pending: VecDeque::new(),
            ctx: 0,
            context_used: 0,
        }
    }

    fn emit(&self, e: Event) {
        let _ = self.tx.send(e);
    }

    fn error(&self, message: String) {
        self.emit(Event::Error { message, fatal: false });
    }

    fn run(mut self) {
        self.connect();
        while let Some(cmd) = self.pending.pop_front().or_else(|| self.rx.recv().ok()) {
            match cmd {
                Command::Shutdown => break,
                Command::Load(_) => self.connect(),
                Command::Submit(req) => self.turn(req),
                Command::Reset => self.context_used = 0,
                Command::Cancel
                | Command::Rewind { .. }
                | Command::SetSampling(_)
                | Command::SetSpeculate(_)
                | Command::SetSpeculateSampling(_)
                | Command::SetPromptStore(_) => {}
                Command::SetDspark(_) => {}
                // A server keeps no cache of ours: nothing to snapshot, and a resumed conversation
                // is simply sent with its next turn.
                Command::SaveSnapshot { path } => self.emit(Event::SnapshotSaved {
                    path,
                    result: Err("a remote server's cache is not saved".into()),
                    tokens: 0,
                    transcript: None,
                }),
                Command::Resume(_) => self.emit(Event::Resumed {
                    tokens: 0,
                    from_snapshot: false,
                    elapsed: std::time::Duration::ZERO,
                    note: Some("remote: the conversation is sent again with the next turn".into()),
                }),
            }
        }
        self.emit(Event::ShutdownComplete);
    }

    /// Asks the server for its models and reports the endpoint as the loaded model. A server that
    /// cannot be reached still "loads" (the panel shows where it points) and the error follows as
    /// a message; the next turn tries again.
    fn connect(&mut self) {
        let base = self.client.target.base.clone();
        self.emit(Event::LoadStarted { what: base.clone() });
        let problem = self.check_model().err();
        self.emit(Event::Loaded(ModelInfo {
            name: self.model.clone().unwrap_or_else(|| "(not known yet)".into()),
            ctx: self.ctx,
            backend: "remote".into(),
            device: base.clone(),
            think_max_available: self.ctx == 0 || self.ctx >= THINK_MAX_MIN_CTX,
            endpoint: Some(base),
            ..Default::default()
        }));
        if let Some(message) = problem {
            self.error(message);
        }
    }

    /// Resolves the model against the server's list (and learns its context).
    fn check_model(&mut self) -> Result<String, String> {
        let models = self.client.models()?;
        let base = &self.client.target.base;
        let chosen = match &self.model {
            Some(want) => match models.iter().find(|m| &m.id == want) {
                Some(m) => m.clone(),
                None => {
                    let names: Vec<&str> = models.iter().map(|m| m.id.as_str()).take(5).collect();
                    return Err(format!(
                        "{base} does not serve the model {want} (it lists: {})",
                        if names.is_empty() {
                            "nothing".into()
                        } else {
                            names.join(", ")
                        }
                    ));
                }
            },
            None => models
                .first()
                .cloned()
                .ok_or_else(|| format!("{base} lists no model"))?,
        };
        self.model = Some(chosen.id.clone());
        self.ctx = chosen.ctx.unwrap_or(0);
        Ok(chosen.id)
    }

    /// Polls commands during a turn (non-blocking).
    fn poll_during_turn(&mut self) -> Interrupt {
        loop {
            match self.rx.try_recv() {
                Ok(Command::Cancel) => return Interrupt::Stop,
                Ok(c @ (Command::Shutdown | Command::Load(_))) => {
                    self.pending.push_back(c);
                    return Interrupt::Stop;
                }
                // Each turn brings its own sampling; a server cannot change it mid-stream.
                Ok(Command::SetSampling(_)) => {}
                Ok(c) => self.pending.push_back(c),
                Err(TryRecvError::Empty) => return Interrupt::None,
                Err(TryRecvError::Disconnected) => {
                    self.pending.push_back(Command::Shutdown);
                    return Interrupt::Stop;
                }
            }
        }
    }

    fn turn(&mut self, req: TurnRequest) {
        let (reason, generated) = self.stream_turn(&req);
        self.emit(Event::TurnFinished {
            reason,
            generated,
            context_used: self.context_used,
        });
    }

    /// One streamed answer; returns why it ended and the tokens generated.
    fn stream_turn(&mut self, req: &TurnRequest) -> (FinishReason, u32) {
        let submitted = Instant::now();
        self.emit(Event::TurnStarted {
            prompt_tokens: 0,
            reused_tokens: 0,
            think: req.think,
            note: None,
        });
        let model = match self.model.clone() {
            Some(m) => m,
            None => match self.check_model() {
                Ok(m) => m,
                Err(message) => {
                    self.error(message);
                    return (FinishReason::Cancelled, 0);
                }
            },
        };
        let body = super::request::body(&model, req);
        let chunks = stream::start(self.client.clone(), body, model);
        let mut turn = StreamedTurn::new(req.think, submitted, self.context_used);
        let reason = loop {
            if self.poll_during_turn() == Interrupt::Stop {
                break FinishReason::Cancelled;
            }
            match chunks.recv_timeout(POLL) {
                Ok(StreamMsg::Chunk(c)) => {
                    for e in turn.chunk(c) {
                        self.emit(e);
                    }
                }
                Ok(StreamMsg::End { done }) => {
                    if !done && turn.finish.is_none() {
                        self.error(format!(
                            "{} closed the stream before the answer finished",
                            self.client.target.base
                        ));
                        break FinishReason::Cancelled;
                    }
                    break turn.finish.unwrap_or(FinishReason::Eos);
                }
                Ok(StreamMsg::Failed(message)) => {
                    self.error(message);
                    break FinishReason::Cancelled;
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.error("the stream reader stopped unexpectedly".into());
                    break FinishReason::Cancelled;
                }
            }
            if let Some(e) = turn.periodic_stats(self.ctx) {
                self.emit(e);
            }
        };
        // Dropping the receiver tells the reading thread to close the connection.
        drop(chunks);
        for e in turn.end(self.ctx) {
            self.emit(e);
        }
        self.context_used = turn.context_used();
        (reason, turn.generated())
    }
}

/// The figures and text state of one streamed turn.
struct StreamedTurn {
    splitter: ThinkSplitter,
    /// The server sends reasoning apart (`reasoning_content`): its content is all answer.
    server_splits: bool,
    submitted: Instant,
    timeline: TurnTimeline,
    /// Chunks that carried text.
    chunks: u32,
    last_chunk: Option<Duration>,
    last_stats: Instant,
    finish: Option<FinishReason>,
    report: Option<ServerReport>,
    /// Context used before the turn.
    context_before: u32,
}

impl StreamedTurn {
    fn new(think: ThinkMode, submitted: Instant, context_before: u32) -> StreamedTurn {
        StreamedTurn {
            splitter: ThinkSplitter::new(think != ThinkMode::Off),
            server_splits: false,
            submitted,
            timeline: TurnTimeline::default(),
            chunks: 0,
            last_chunk: None,
            last_stats: Instant::now(),
            finish: None,
            report: None,
            context_before,
        }
    }

    /// The events of one chunk: its text, and the first-token or per-token timing.
    fn chunk(&mut self, c: super::chunk::Chunk) -> Vec<Event> {
        let mut pieces = Vec::new();
        if let Some(r) = c.reasoning {
            self.server_splits = true;
            pieces.push((TextKind::Reasoning, r));
        }
        if let Some(text) = c.content {
            if self.server_splits {
                pieces.push((TextKind::Answer, text));
            } else {
                self.splitter.push(&text, &mut pieces);
            }
        }
        if let Some(f) = c.finish_reason {
            self.finish = Some(finish_reason(&f));
        }
        if let Some(r) = c.report {
            self.report = Some(r);
        }
        let mut events = Vec::new();
        if !pieces.is_empty() {
            events.extend(self.timing());
        }
        events.extend(pieces.into_iter().map(|(kind, text)| Event::Text { kind, text }));
        events
    }

    /// A chunk with text arrived now.
    fn timing(&mut self) -> Option<Event> {
        let at = self.submitted.elapsed();
        self.chunks += 1;
        let previous = self.last_chunk.replace(at);
        match previous {
            None => {
                self.timeline.prefill_started(Duration::ZERO);
                self.timeline.token_sampled(at);
                self.timeline.prefill_finished(at, 0);
                Some(Event::PrefillDone { tokens: 0, elapsed: at })
            }
            Some(prev) => {
                self.timeline.decode_step_finished(at);
                Some(Event::TokenTiming {
                    step: self.chunks - 1,
                    elapsed: at.saturating_sub(prev),
                })
            }
        }
    }

    fn periodic_stats(&mut self, ctx: u32) -> Option<Event> {
        if self.chunks == 0 || self.last_stats.elapsed() < STATS_PERIOD {
            return None;
        }
        self.last_stats = Instant::now();
        Some(Event::Stats(self.stats(ctx)))
    }

    fn stats(&self, ctx: u32) -> LiveStats {
        self.timeline.stats(self.context_used(), ctx, &MemoryReport::default())
    }

    /// The events after the last chunk: text the splitter held back, the server's report, the
    /// turn's final figures.
    fn end(&mut self, ctx: u32) -> Vec<Event> {
        let mut pieces = Vec::new();
        self.splitter.finish(&mut pieces);
        let mut events: Vec<Event> = pieces
            .into_iter()
            .map(|(kind, text)| Event::Text { kind, text })
            .collect();
        if let Some(r) = &self.report {
            events.push(Event::Server(r.clone()));
        }
        if self.chunks > 0 || self.report.is_some() {
            events.push(Event::Stats(self.stats(ctx)));
        }
        events
    }

    /// The server's count when it gave one (prompt + completion), else the count before the turn
    /// plus the chunks streamed (a lower bound: the new prompt is not counted).
    fn context_used(&self) -> u32 {
        match &self.report {
            Some(ServerReport {
                prompt_tokens: Some(p),
                completion_tokens: Some(c),
                ..
            }) => p + c,
            _ => self.context_before + self.generated(),
        }
    }

    fn generated(&self) -> u32 {
        self.report
            .as_ref()
            .and_then(|r| r.completion_tokens)
            .unwrap_or(self.chunks)
    }
}

/// The engine's finish reason for an OpenAI `finish_reason`.
fn finish_reason(s: &str) -> FinishReason {
    match s {
        "length" => FinishReason::Length,
        _ => FinishReason::Eos,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::chunk::Chunk;

    fn texts(events: &[Event]) -> Vec<(TextKind, String)> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Text { kind, text } => Some((*kind, text.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_split_stream_becomes_the_engine_events() {
        let mut turn = StreamedTurn::new(ThinkMode::High, Instant::now(), 100);
        let ev = turn.chunk(Chunk {
            reasoning: Some("hmm".into()),
            ..Default::default()
        });
        assert!(matches!(ev[0], Event::PrefillDone { tokens: 0, .. }), "{ev:?}");
        assert_eq!(texts(&ev), vec![(TextKind::Reasoning, "hmm".to_string())]);
        let ev = turn.chunk(Chunk {
            content: Some("Yes.".into()),
            ..Default::default()
        });
        assert!(matches!(ev[0], Event::TokenTiming { step: 1, .. }), "{ev:?}");
        assert_eq!(texts(&ev), vec![(TextKind::Answer, "Yes.".to_string())]);
        // Without usage: the context grows by the chunks streamed.
        assert_eq!((turn.generated(), turn.context_used()), (2, 102));
        // A role-only chunk carries no text and no timing.
        assert!(turn.chunk(Chunk::default()).is_empty());
        let report = ServerReport {
            prompt_tokens: Some(40),
            completion_tokens: Some(3),
            ..Default::default()
        };
        turn.chunk(Chunk {
            finish_reason: Some("length".into()),
            report: Some(report.clone()),
            ..Default::default()
        });
        assert_eq!(turn.finish, Some(FinishReason::Length));
        let end = turn.end(4096);
        assert!(matches!(&end[0], Event::Server(r) if *r == report), "{end:?}");
        match &end[1] {
            Event::Stats(s) => {
                assert_eq!((s.context_used, s.context_size), (43, 4096));
                assert!(s.prefill_latency.is_some());
            }
            other => panic!("{other:?}"),
        }
        assert_eq!((turn.generated(), turn.context_used()), (3, 43));
    }

    #[test]
    fn inline_reasoning_is_split_until_the_server_splits() {
        let mut turn = StreamedTurn::new(ThinkMode::Off, Instant::now(), 0);
        let mut all = Vec::new();
        for piece in ["<think>a", "b</think>", "c"] {
            all.extend(turn.chunk(Chunk {
                content: Some(piece.into()),
                ..Default::default()
            }));
        }
        all.extend(turn.end(0));
        assert_eq!(
            texts(&all),
            vec![
                (TextKind::Reasoning, "a".into()),
                (TextKind::Reasoning, "b".into()),
                (TextKind::Answer, "c".into())
            ]
        );
        assert_eq!(finish_reason("stop"), FinishReason::Eos);
        assert_eq!(finish_reason("tool_calls"), FinishReason::Eos);
    }
}
