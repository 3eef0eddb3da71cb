//! The engine worker thread: owns the engine (the model on its device), the live session on it, and
//! talks to its client (the TUI, `run`, tests) only through `Command`s in and `Event`s out (events.rs).
//! A `Load` that differs from the loaded one only in its context (`/ctx N`) opens a new session on
//! the same engine: the file is not read again and the weights stay where they are.
//!
//! Threads: the worker thread runs commands one at a time; a warm-up (warmup.rs) runs on its own
//! threads and reports through the worker at 5 Hz; a residency thread samples the mapping at most
//! once a second (residency.rs) and sends its events directly. Nothing else touches the model.
//!
//! Guarantees:
//! * Every `Submit` ends in exactly one `TurnFinished` (after a worker panic: `Error{fatal}`, then
//!   `TurnFinished{Cancelled}`).
//! * `Cancel` is honoured between two prefill chunks (the command channel is polled inside the
//!   progress callback) and between two decode steps, so its latency is at most one chunk or one
//!   token. The session stays consistent at the tokens evaluated so far and the next turn reuses
//!   that live prefix.
//! * A panic while handling a command is caught; it becomes `Error{fatal: true}`, the model is
//!   dropped (its state is unknown) and the worker keeps serving commands (a new `Load` works).
//! * Commands arriving during a turn: `Cancel` ends it; `Shutdown` and `Load` end it and then run;
//!   `SetSampling` applies from the next token; the rest wait until the turn has finished.
//!
//! Owns the command loop; one chat turn's flow is in worker/turn.rs. Must not render anything,
//! compute kernels, or know terminal types.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::backend::{BackendError, DeviceModel, DeviceSession};
use crate::model::chat::{Conversation, THINK_MAX_MIN_CTX, ThinkMode};

use super::events::{Command, Event, FinishReason, LoadRequest, ModelInfo, SamplingParams, TextKind, WarmupPhase};
use super::prompt_cache::PromptCache;
use super::prompt_store::PromptStoreSettings;
use super::speculate::Speculate;
use super::speculate::accept::SamplingRule;
use super::warmup::{WarmupJob, WarmupStatus, default_warmup_threads};
use crate::backend::residency::{MappedRegion, ResidencyProbe};
use crate::sessions::store::TranscriptIds;
use residency_thread::ResidencyThread;

/// Name of the worker thread. A process-wide panic hook (the TUI's terminal-restoring one) must
/// leave panics on this thread alone: they are caught and reported as `Event::Error{fatal}` while
/// the UI keeps running, so restoring the terminal or printing to it there would break the screen.
pub const WORKER_THREAD: &str = "ds4-worker";

/// Warm-up progress period (5 Hz: the warm-up bar moves at least 4 times a second).
const WARMUP_TICK: Duration = Duration::from_millis(200);

/// The text side of chat turns: rendering the conversation to prompt tokens and streaming sampled
/// tokens back to text. Implemented over the tokenizer, chat renderer and streaming detokenizer.
pub trait ChatText: Send {
    /// Prompt tokens for `conv` (ending with the new user message) in `think` mode. `live` holds
    /// the tokens cached in the session: an implementation keeping a live transcript appends to it
    /// when `conv` continues the conversation it rendered last, and renders from scratch otherwise.
    fn prompt(&mut self, conv: &Conversation, think: ThinkMode, live: &[u32]) -> Result<Vec<u32>, String>;
    /// The turn for `conv` ended with `generated` sampled tokens (EOS excluded) for `reason`.
    fn turn_done(&mut self, conv: &Conversation, generated: &[u32], reason: FinishReason);
    /// The session was reset or rewound: the next prompt is rendered from scratch.
    fn forget(&mut self);
    /// End-of-sentence token id.
    fn eos(&self) -> u32;
    /// A streaming decoder for one turn; starts in reasoning when `think` is not Off.
    fn stream(&self, think: ThinkMode) -> Box<dyn TextStream>;
    /// A fresh chat text (nothing rendered yet) for a new session of `ctx` tokens on the same model,
    /// sharing this one's tokenizer.
    fn for_context(&self, ctx: u32) -> Box<dyn ChatText>;
    /// Where the prompt last returned by `prompt` stops being shared with other conversations: the
    /// token count of its start (BOS, effort text, system prompt and tools), for the prompt store's
    /// prefix snapshots. None when unknown.
    fn shared_prefix(&self) -> Option<usize> {
        None
    }
    /// The transcript at the last turn boundary (what a session file keeps to resume from).
    fn transcript(&self) -> Option<TranscriptIds> {
        None
    }
    /// Continue from a saved transcript: a later conversation starting with `messages` extends
    /// `ids` token for token. Errors say why the ids cannot be one.
    fn resume(&mut self, messages: &[crate::model::chat::Message], ids: &[u32]) -> Result<(), String> {
        let _ = (messages, ids);
        Err("this chat text cannot resume a transcript".into())
    }
}

/// Streaming detokenizer of one turn: whole UTF-8 pieces, split into reasoning and answer.
pub trait TextStream: Send {
    fn push(&mut self, token: u32, out: &mut Vec<(TextKind, String)>);
    /// Flush what was held back (partial UTF-8, partial tags) at the end of the turn.
    fn finish(&mut self, out: &mut Vec<(TextKind, String)>);
}

/// Everything a load produces.
pub struct LoadedModel {
    /// The model on its device, kept for later device sessions (`/ctx`); `None` when the loader has
    /// none (then every load loads again).
    pub device_model: Option<Box<dyn DeviceModel>>,
    /// The first device session opened from it.
    pub session: Box<dyn DeviceSession>,
    pub text: Box<dyn ChatText>,
    pub info: ModelInfo,
    /// The file mapping to warm up (None for in-memory models).
    pub warmup: Option<Arc<dyn MappedRegion>>,
    /// Residency sampler of the mapping.
    pub residency: Option<ResidencyProbe>,
}

/// Turns a `LoadRequest` into a loaded model. `notice` reports progress or warnings as events.
pub trait ModelLoader: Send {
    fn load(&mut self, req: &LoadRequest, notice: &mut dyn FnMut(Event)) -> Result<LoadedModel, String>;
}

/// Turn-boundary checkpoints the prompt cache keeps for retried or edited conversations. Each holds the
/// live cache rows (docs/model.md#checkpoints), up to the KV size at a full context, so keep few.
pub const PROMPT_CACHE_CHECKPOINTS: usize = 2;

struct Loaded {
    /// The prompt cache over the device session.
    session: PromptCache,
    text: Box<dyn ChatText>,
    device_model: Option<Box<dyn DeviceModel>>,
    /// What was loaded and what `Loaded` said about it, for a new device session on the same model.
    request: LoadRequest,
    info: ModelInfo,
    /// The DSpark drafter attached to this session, between turns.
    dspark: Option<Box<dyn crate::engine::speculate::drafter::Drafter>>,
}

/// Whether `next` asks for the model `loaded` was made for, on the same engine settings: then only
/// the context differs and a new session on the loaded engine serves it.
fn same_engine(loaded: &LoadRequest, next: &LoadRequest) -> bool {
    use super::events::ModelSource::{Demo, File};
    let same_source = match (&loaded.source, &next.source) {
        (File(a), File(b)) => a == b,
        (Demo { seed: a }, Demo { seed: b }) => a == b,
        _ => false,
    };
    same_source
        && loaded.backend == next.backend
        && loaded.weights == next.weights
        && loaded.arithmetic == next.arithmetic
        && loaded.threads == next.threads
}

/// The model a load request names, for `LoadStarted`.
fn source_name(source: &super::events::ModelSource) -> String {
    match source {
        super::events::ModelSource::File(p) => p.display().to_string(),
        super::events::ModelSource::Demo { seed } => format!("demo model (seed {seed})"),
    }
}

/// Client side of the worker: a command sender, an event receiver and the thread.
pub struct Worker {
    tx: Sender<Command>,
    rx: Receiver<Event>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Start a worker that loads models with `loader`.
    pub fn spawn(loader: Box<dyn ModelLoader>) -> Worker {
        Worker::spawn_with(move |commands, events| WorkerState::new(loader, commands, events).run())
    }

    /// Start a worker whose thread runs `serve` over the two channels: another implementation of
    /// the same command/event contract (the remote worker, `remote::worker`). `serve` must answer
    /// `Shutdown` by returning.
    pub fn spawn_with(serve: impl FnOnce(Receiver<Command>, Sender<Event>) + Send + 'static) -> Worker {
        let (tx, cmd_rx) = mpsc::channel();
        let (ev_tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(WORKER_THREAD.into())
            .spawn(move || serve(cmd_rx, ev_tx))
            .expect("spawn the engine worker thread");
        Worker {
            tx,
            rx,
            thread: Some(thread),
        }
    }

    /// Queue a command; false when the worker is gone.
    pub fn send(&self, c: Command) -> bool {
        self.tx.send(c).is_ok()
    }

    /// A sender for other threads (e.g. a signal handler sending `Cancel`).
    pub fn sender(&self) -> Sender<Command> {
        self.tx.clone()
    }

    pub fn try_recv(&self) -> Option<Event> {
        self.rx.try_recv().ok()
    }

    pub fn recv_timeout(&self, d: Duration) -> Option<Event> {
        self.rx.recv_timeout(d).ok()
    }

    /// The event receiver, for `select`-style loops.
    pub fn events(&self) -> &Receiver<Event> {
        &self.rx
    }

    /// Ask the worker to stop and wait for it; the events left are returned.
    pub fn shutdown(mut self) -> Vec<Event> {
        let _ = self.tx.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.rx.try_iter().collect()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = self.tx.send(Command::Shutdown);
            let _ = t.join();
        }
    }
}

/// Flow after a command.
enum Flow {
    Continue,
    Shutdown,
}

struct WorkerState {
    loader: Box<dyn ModelLoader>,
    inbox: Inbox,
    tx: Sender<Event>,
    loaded: Option<Loaded>,
    warmup: Option<WarmupJob>,
    residency: Option<ResidencyThread>,
    /// A turn is being handled (so a panic must still end it with `TurnFinished`).
    turn_in_flight: bool,
    /// The drafter of speculative decoding (`SetSpeculate`).
    speculate: Speculate,
    /// How drafts are accepted when sampling (`SetSpeculateSampling`).
    speculate_sampling: SamplingRule,
    /// The notice that this backend decodes plainly despite `speculate` was given.
    speculate_notice_given: bool,
    /// The prompt store each new session opens (`SetPromptStore`).
    prompt_store: Option<PromptStoreSettings>,
    /// The DSpark drafter's settings (`SetDspark`), for `speculate` dspark.
    dspark: crate::engine::speculate::dspark::DsparkSettings,
}

/// The worker's side of the command channel, with what a turn in flight sets aside.
struct Inbox {
    rx: Receiver<Command>,
    /// Commands that arrived during a turn and wait for it to end.
    pending: VecDeque<Command>,
    /// Latest `SetSampling`, applied to the turn in flight from the next token.
    sampling_override: Option<SamplingParams>,
}

impl Inbox {
    /// Poll commands during a turn (non-blocking).
    fn poll_during_turn(&mut self) -> Interrupt {
        let Inbox {
            rx,
            pending,
            sampling_override: sampling,
        } = self;
        loop {
            match rx.try_recv() {
                Ok(Command::Cancel) => return Interrupt::Stop,
                Ok(c @ (Command::Shutdown | Command::Load(_))) => {
                    pending.push_back(c);
                    return Interrupt::Stop;
                }
                Ok(Command::SetSampling(p)) => *sampling = Some(p),
                Ok(c) => pending.push_back(c),
                Err(TryRecvError::Empty) => return Interrupt::None,
                Err(TryRecvError::Disconnected) => {
                    pending.push_back(Command::Shutdown);
                    return Interrupt::Stop;
                }
            }
        }
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// What a poll of the command channel during a turn decided.
#[derive(PartialEq)]
enum Interrupt {
    None,
    /// Stop the turn (Cancel, or Load/Shutdown queued to run next).
    Stop,
}

impl WorkerState {
    fn new(loader: Box<dyn ModelLoader>, rx: Receiver<Command>, tx: Sender<Event>) -> WorkerState {
        WorkerState {
            loader,
            inbox: Inbox {
                rx,
                pending: VecDeque::new(),
                sampling_override: None,
            },
            tx,
            loaded: None,
            warmup: None,
            residency: None,
            turn_in_flight: false,
            speculate: Speculate::Off,
            speculate_sampling: SamplingRule::Exact,
            speculate_notice_given: false,
            prompt_store: None,
            dspark: Default::default(),
        }
    }

    fn emit(&self, e: Event) {
        // A dropped receiver means the client is gone; the loop ends on the closed command side.
        let _ = self.tx.send(e);
    }

    fn run(mut self) {
        while let Some(cmd) = self.next_command() {
            let outcome = catch_unwind(AssertUnwindSafe(|| self.handle(cmd)));
            match outcome {
                Ok(Flow::Continue) => {}
                Ok(Flow::Shutdown) => break,
                Err(p) => {
                    // The session may be half-updated: drop the model; the client may load again.
                    self.unload();
                    self.emit(Event::Error {
                        message: format!("engine worker panicked: {}; load the model again", panic_message(&*p)),
                        fatal: true,
                    });
                    if std::mem::take(&mut self.turn_in_flight) {
                        self.emit(Event::TurnFinished {
                            reason: FinishReason::Cancelled,
                            generated: 0,
                            context_used: 0,
                        });
                    }
                }
            }
        }
        self.unload();
        self.emit(Event::ShutdownComplete);
    }

    /// The next command: queued ones first; while a warm-up runs, wake every tick to report it.
    fn next_command(&mut self) -> Option<Command> {
        if let Some(c) = self.inbox.pending.pop_front() {
            return Some(c);
        }
        loop {
            if self.warmup.is_none() {
                return self.inbox.rx.recv().ok();
            }
            match self.inbox.rx.recv_timeout(WARMUP_TICK) {
                Ok(c) => return Some(c),
                Err(RecvTimeoutError::Timeout) => self.report_warmup(),
                Err(RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    fn report_warmup(&mut self) {
        let Some(job) = &self.warmup else { return };
        let s = job.status();
        self.emit_page_in_progress(&s);
        if s.finished {
            let s = self.warmup.take().expect("checked above").stop();
            self.emit(Event::WarmupDone {
                total_bytes: s.total_bytes,
                elapsed: s.elapsed,
            });
        }
    }

    fn emit_page_in_progress(&self, s: &WarmupStatus) {
        self.emit(Event::WarmupProgress {
            phase: WarmupPhase::PageIn,
            done_bytes: s.done_bytes,
            total_bytes: s.total_bytes,
            elapsed: s.elapsed,
        });
    }

    fn unload(&mut self) {
        if let Some(w) = self.warmup.take() {
            w.stop();
        }
        if let Some(r) = self.residency.take() {
            r.stop();
        }
        self.loaded = None;
    }

    fn handle(&mut self, cmd: Command) -> Flow {
        match cmd {
            Command::Shutdown => return Flow::Shutdown,
            Command::Load(req) => self.load(req),
            Command::Submit(turn) => self.turn(turn),
            Command::Cancel => {
                // Nothing in flight but maybe a warm-up: stop it (the turn-time cancel is polled
                // inside `turn`).
                if let Some(w) = self.warmup.take() {
                    self.emit_page_in_progress(&w.stop());
                }
            }
            Command::Reset => {
                if let Some(l) = &mut self.loaded {
                    l.session.reset();
                    l.text.forget();
                }
            }
            Command::Rewind { keep_tokens } => self.rewind(keep_tokens as usize),
            Command::SetSampling(p) => self.inbox.sampling_override = Some(p),
            Command::SetSpeculate(s) => self.speculate = s,
            Command::SetSpeculateSampling(r) => self.speculate_sampling = r,
            Command::SetDspark(d) => self.dspark = d,
            Command::SaveSnapshot { path } => self.save_snapshot(path),
            Command::Resume(req) => self.resume(req),
            Command::SetPromptStore(settings) => {
                self.prompt_store = settings;
                self.open_prompt_store();
            }
        }
        Flow::Continue
    }

    /// Shorten the session (after /edit or /retry). The session rebuilds the shorter state from a
    /// checkpoint or by evaluating the kept tokens again; that evaluation is cancellable. The chat
    /// text needs no notice: it matches the next conversation against its own turn snapshots.
    fn rewind(&mut self, keep: usize) {
        let WorkerState { inbox, tx, loaded, .. } = self;
        let Some(l) = loaded else { return };
        let r = l
            .session
            .rewind(keep, &mut |_, _| inbox.poll_during_turn() == Interrupt::None);
        match r {
            Ok(()) | Err(BackendError::Cancelled { .. }) => {}
            Err(e) => {
                l.session.reset();
                let _ = tx.send(Event::Error {
                    message: format!("rewind failed, the session starts over: {e}"),
                    fatal: false,
                });
            }
        }
    }

    fn load(&mut self, req: LoadRequest) {
        let reusable = self
            .loaded
            .take_if(|l| l.device_model.is_some() && same_engine(&l.request, &req));
        if let Some(mut l) = reusable
            && let Some(engine) = l.device_model.take()
        {
            return self.reopen(l, engine, req);
        }
        self.unload();
        self.emit(Event::LoadStarted {
            what: source_name(&req.source),
        });
        let tx = self.tx.clone();
        let result = self.loader.load(&req, &mut |e| {
            let _ = tx.send(e);
        });
        match result {
            Err(message) => self.emit(Event::Error { message, fatal: true }),
            Ok(m) => {
                self.start_session(m.session, m.text, m.device_model, req, m.info);
                if let Some(region) = m.warmup {
                    self.warmup = Some(WarmupJob::start(region, default_warmup_threads()));
                }
                if let Some(probe) = m.residency {
                    self.residency = Some(ResidencyThread::start(probe, self.tx.clone()));
                }
            }
        }
    }

    /// Report a loaded session (its context and memory in `info`) and make it the live one.
    fn start_session(
        &mut self,
        backend: Box<dyn DeviceSession>,
        text: Box<dyn ChatText>,
        engine: Option<Box<dyn DeviceModel>>,
        request: LoadRequest,
        mut info: ModelInfo,
    ) {
        let mem = backend.memory();
        info.kv_bytes = mem.kv_bytes;
        info.scratch_bytes = mem.scratch_bytes;
        info.ctx = backend.ctx() as u32;
        info.think_max_available = info.ctx >= THINK_MAX_MIN_CTX;
        self.loaded = Some(Loaded {
            session: PromptCache::new(backend, PROMPT_CACHE_CHECKPOINTS),
            text,
            device_model: engine,
            request,
            info: info.clone(),
            dspark: None,
        });
        // Its notices come before `Loaded`, so a client that stops reading there has them.
        self.open_prompt_store();
        self.emit(Event::Loaded(info));
        if let Some(dm) = super::metrics::device_memory(&mem) {
            self.emit(Event::DeviceMemory(dm));
        }
    }

    /// A new session of `req.ctx` tokens on the loaded engine; the warm-up and residency sampler of
    /// the mapping carry on. The old session is dropped first, so the memory guard counts its memory
    /// as free. When the new one is refused, a session of the old context is opened again and the
    /// refusal is reported as a (non-fatal) error; only when that fails too is the model unloaded.
    fn reopen(&mut self, old: Loaded, engine: Box<dyn DeviceModel>, req: LoadRequest) {
        let Loaded {
            session,
            text,
            request,
            info,
            ..
        } = old;
        let old_ctx = session.ctx();
        drop(session);
        self.emit(Event::LoadStarted {
            what: format!(
                "{}: a session of {} tokens on the loaded weights",
                source_name(&req.source),
                req.ctx
            ),
        });
        let tx = self.tx.clone();
        let mut notice = |e: Event| {
            let _ = tx.send(e);
        };
        let (backend, request) = match super::loader::open_session(engine.as_ref(), req.ctx as usize, &mut notice) {
            Ok(backend) => (backend, req),
            Err(refused) => match super::loader::open_session(engine.as_ref(), old_ctx, &mut notice) {
                Ok(backend) => {
                    self.emit(Event::Error {
                        message: format!("{refused}; the context stays {old_ctx}"),
                        fatal: false,
                    });
                    (backend, request)
                }
                Err(_) => {
                    self.unload();
                    self.emit(Event::Error {
                        message: refused,
                        fatal: true,
                    });
                    return;
                }
            },
        };
        let text = text.for_context(backend.ctx() as u32);
        self.start_session(backend, text, Some(engine), request, info);
    }
}

mod persist;
mod prompt_store;
mod residency_thread;
#[cfg(test)]
pub(crate) mod tests;
mod turn;
