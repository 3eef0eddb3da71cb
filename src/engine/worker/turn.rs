//! One chat turn on the worker: the prompt, prefill with cancel polling between chunks, decode
//! through `generate` with the worker's hooks (text, timing and stats events), and the turn's end.

use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use super::{Inbox, Interrupt, TextStream, WorkerState};
use crate::backend::BackendError;
use crate::engine::events::{Event, FinishReason, SamplingParams, TextKind, TurnRequest};
use crate::engine::generate::{
    GenerateError, Hooks, Limits, Speculation, Stop, generate, generate_speculative, sample_next,
};
use crate::engine::metrics::TurnTimeline;
use crate::engine::prompt_cache::PromptCache;
use crate::engine::sampler::Sampler;
use crate::engine::speculate::Speculate;
use crate::engine::speculate::accept::{BlockLogits, Outcome, SamplingRule, accept};
use crate::engine::speculate::drafter::Draft;
use crate::model::chat::THINK_MAX_MIN_CTX;

/// Least time between two prefill progress events, and between two live stats while decoding.
const PREFILL_EVENT_PERIOD: Duration = Duration::from_millis(50);
const STATS_PERIOD: Duration = Duration::from_millis(250);

impl WorkerState {
    pub(super) fn turn(&mut self, req: TurnRequest) {
        let submitted = Instant::now();
        if self.loaded.is_none() {
            self.emit(Event::Error {
                message: "no model loaded".into(),
                fatal: false,
            });
            self.emit(Event::TurnFinished {
                reason: FinishReason::Cancelled,
                generated: 0,
                context_used: 0,
            });
            return;
        }
        // The warm-up yields to the turn (see warmup.rs for the policy).
        if let Some(w) = &self.warmup {
            w.pause();
        }
        self.inbox.sampling_override = None;
        self.turn_in_flight = true;
        let reason = self.run_turn(&req, submitted);
        self.turn_in_flight = false;
        let context_used = self.loaded.as_ref().map_or(0, |l| l.session.tokens().len() as u32);
        let (generated, reason) = reason;
        self.emit(Event::TurnFinished {
            reason,
            generated,
            context_used,
        });
        // After the turn's end is out, so the client has its answer while the files are written.
        self.persist_prompt();
        if let Some(w) = &self.warmup {
            w.resume();
        }
    }

    /// The chat flow of one turn; returns (generated tokens, why it ended).
    fn run_turn(&mut self, req: &TurnRequest, submitted: Instant) -> (u32, FinishReason) {
        let WorkerState {
            inbox,
            tx,
            loaded,
            speculate,
            speculate_notice_given,
            speculate_sampling,
            dspark,
            ..
        } = self;
        let l = loaded.as_mut().expect("checked by the caller");
        let emit = |e: Event| {
            let _ = tx.send(e);
        };
        let ctx = l.session.ctx();
        let think = req.think.for_context(ctx as u32);
        let note = (think != req.think)
            .then(|| format!("Think Max needs --ctx {THINK_MAX_MIN_CTX} or more; using high thinking"));
        let prompt = match l.text.prompt(&req.conversation, think, l.session.tokens()) {
            Ok(p) => p,
            Err(message) => {
                emit(Event::Error { message, fatal: false });
                return (0, FinishReason::Cancelled);
            }
        };
        if prompt.len() >= ctx {
            emit(Event::Error {
                message: format!(
                    "prompt is {} tokens, the context holds {} (raise --ctx or start a new chat)",
                    prompt.len(),
                    ctx
                ),
                fatal: false,
            });
            return (0, FinishReason::ContextFull);
        }
        // The live prefix the sync will keep. (When the session restores a checkpoint instead, the
        // reuse shows in PrefillDone: fewer tokens evaluated than prompt − reused.)
        let live = l.session.tokens();
        let reused = if prompt.starts_with(live) { live.len() } else { 0 };
        emit(Event::TurnStarted {
            prompt_tokens: prompt.len() as u32,
            reused_tokens: reused as u32,
            think,
            note,
        });

        // The DSpark drafter is attached once per session, before its first prefill, so it reads the
        // prompt's target rows; one that cannot be attached is said once and the turn decodes plainly.
        if *speculate == Speculate::Dspark && l.dspark.is_none() {
            let model = l.device_model.as_ref().map(|m| m.model().clone());
            let opened = match model {
                Some(m) => dspark.open(&m, l.session.backend_mut(), ctx),
                None => Err("speculate dspark needs the model's engine".to_string()),
            };
            match opened {
                Ok((drafter, warning)) => {
                    l.dspark = Some(drafter);
                    if let Some(message) = warning {
                        emit(Event::Notice { message });
                    }
                }
                Err(message) => {
                    *speculate = Speculate::Off;
                    emit(Event::Error { message, fatal: false });
                }
            }
        }
        // Prefill, polling commands inside the progress callback (between chunks).
        let mut tl = TurnTimeline::default();
        let prefill_start = Instant::now();
        tl.prefill_started(prefill_start - submitted);
        let mut progress = PrefillProgress::new(prefill_start);
        let mut stopped = false;
        let sync = l
            .session
            .sync_marked(&prompt, l.text.shared_prefix(), &mut |done, total| {
                progress.report(tx, done, total);
                stopped = inbox.poll_during_turn() == Interrupt::Stop;
                !stopped
            });
        for message in l.session.take_store_notices() {
            emit(Event::Notice { message });
        }
        let evaluated = match sync {
            Ok(report) => report.evaluated,
            Err(BackendError::Cancelled { .. }) => {
                // The cache keeps what was evaluated; the next turn's prompt reuses it.
                l.text.turn_done(&req.conversation, &[], FinishReason::Cancelled);
                return (0, FinishReason::Cancelled);
            }
            Err(BackendError::ContextFull { needed, ctx }) => {
                emit(Event::Error {
                    message: format!("context full: {needed} tokens needed, context is {ctx} (raise --ctx)"),
                    fatal: false,
                });
                l.text.turn_done(&req.conversation, &[], FinishReason::ContextFull);
                return (0, FinishReason::ContextFull);
            }
            Err(e) => {
                emit(Event::Error {
                    message: e.to_string(),
                    fatal: false,
                });
                l.session.reset();
                l.text.forget();
                return (0, FinishReason::Cancelled);
            }
        };
        tl.prefill_finished(submitted.elapsed(), evaluated as u32);
        emit(Event::PrefillDone {
            tokens: evaluated as u32,
            elapsed: prefill_start.elapsed(),
        });
        if stopped {
            // Cancel arrived with the last chunk: the prompt is cached, nothing generated.
            l.text.turn_done(&req.conversation, &[], FinishReason::Cancelled);
            return (0, FinishReason::Cancelled);
        }

        // Decode: sample → detokenize → Text events → evaluate the token (generate.rs). Each
        // sampled token must fit in the cache: at most ctx − cached − 1 new tokens.
        let max_tokens = req.max_tokens as usize;
        let room = ctx.saturating_sub(l.session.tokens().len() + 1);
        let limits = Limits {
            max_new: max_tokens.min(room),
            stop_token: Some(l.text.eos()),
            decode_last: true,
        };
        emit(live_stats(&tl, &l.session));
        let mut hooks = TurnHooks {
            sampler: Sampler::new(req.sampling.seed),
            params: req.sampling.clone(),
            rule: *speculate_sampling,
            stream: l.text.stream(think),
            generated: Vec::new(),
            pieces: Vec::new(),
            tl: &mut tl,
            submitted,
            step_start: Instant::now(),
            last_stats: Instant::now(),
            tx,
            inbox,
        };
        let drafter = match *speculate {
            Speculate::Dspark => l.dspark.take(),
            s => s.drafter(),
        };
        let mut spec = drafter.map(|d| Speculation::new(d, l.session.tokens()));
        if spec.is_some() && !l.session.has_block_verify() && !*speculate_notice_given {
            *speculate_notice_given = true;
            emit(Event::Notice {
                message: format!(
                    "the {} backend has no block verify: speculate {} decodes plainly",
                    l.session.backend().name(),
                    speculate.name()
                ),
            });
        }
        let result = match spec.as_mut() {
            Some(spec) => generate_speculative(&mut l.session, limits, &mut hooks, spec),
            None => generate(&mut l.session, limits, &mut hooks),
        };
        let figures = spec.as_ref().map(|s| s.figures);
        if *speculate == Speculate::Dspark {
            l.dspark = spec.map(|s| s.into_drafter());
        }
        let TurnHooks {
            mut stream,
            generated,
            mut pieces,
            ..
        } = hooks;
        let reason = match result {
            Ok((_, Stop::Eos)) => FinishReason::Eos,
            Ok((n, Stop::Budget)) if n >= max_tokens => FinishReason::Length,
            Ok((_, Stop::Budget)) => FinishReason::ContextFull,
            Ok((_, Stop::Halted)) => FinishReason::Cancelled,
            Err(e) => {
                let message = match e {
                    GenerateError::Sample(e) | GenerateError::Decode(e) => e.to_string(),
                    GenerateError::Hook(m) => m,
                };
                emit(Event::Error { message, fatal: false });
                FinishReason::Cancelled
            }
        };
        stream.finish(&mut pieces);
        for (kind, text) in pieces.drain(..) {
            emit(Event::Text { kind, text });
        }
        emit(live_stats(&tl, &l.session));
        if let Some(figures) = figures {
            emit(Event::Speculation(figures));
        }
        l.text.turn_done(&req.conversation, &generated, reason);
        (generated.len() as u32, reason)
    }
}

/// `PrefillProgress` events of one evaluation: at most one per `PREFILL_EVENT_PERIOD`, and the last.
pub(super) struct PrefillProgress {
    start: Instant,
    last: Instant,
}

impl PrefillProgress {
    pub(super) fn new(start: Instant) -> PrefillProgress {
        PrefillProgress {
            start,
            last: Instant::now() - PREFILL_EVENT_PERIOD,
        }
    }

    pub(super) fn report(&mut self, tx: &Sender<Event>, done: usize, total: usize) {
        if self.last.elapsed() >= PREFILL_EVENT_PERIOD || done == total {
            self.last = Instant::now();
            let _ = tx.send(Event::PrefillProgress {
                done: done as u32,
                total: total as u32,
                elapsed: self.start.elapsed(),
            });
        }
    }
}

/// A snapshot of the turn's figures for the UI.
fn live_stats(tl: &TurnTimeline, session: &PromptCache) -> Event {
    Event::Stats(tl.stats(
        session.tokens().len() as u32,
        session.ctx() as u32,
        &session.backend().memory(),
    ))
}

/// The worker's side of each decode step: sampling changes, text and timing events, cancel.
struct TurnHooks<'a> {
    sampler: Sampler,
    params: SamplingParams,
    /// How a speculative block's drafts are accepted when sampling.
    rule: SamplingRule,
    stream: Box<dyn TextStream>,
    generated: Vec<u32>,
    pieces: Vec<(TextKind, String)>,
    tl: &'a mut TurnTimeline,
    submitted: Instant,
    step_start: Instant,
    last_stats: Instant,
    tx: &'a Sender<Event>,
    inbox: &'a mut Inbox,
}

impl Hooks<PromptCache> for TurnHooks<'_> {
    fn pick(&mut self, session: &mut PromptCache) -> Result<u32, BackendError> {
        self.step_start = Instant::now();
        if let Some(p) = self.inbox.sampling_override.take() {
            self.params = p;
        }
        let token = sample_next(session, &mut self.sampler, &self.params)?;
        self.tl.token_sampled(self.submitted.elapsed());
        Ok(token)
    }

    fn token(&mut self, token: u32) -> Result<(), String> {
        self.generated.push(token);
        self.stream.push(token, &mut self.pieces);
        for (kind, text) in self.pieces.drain(..) {
            if kind == TextKind::Answer && !text.trim().is_empty() {
                self.tl.answer_visible(self.submitted.elapsed());
            }
            let _ = self.tx.send(Event::Text { kind, text });
        }
        Ok(())
    }

    fn decoded(&mut self, session: &PromptCache, generated: usize) -> bool {
        self.tl.decode_step_finished(self.submitted.elapsed());
        let _ = self.tx.send(Event::TokenTiming {
            step: generated as u32,
            elapsed: self.step_start.elapsed(),
        });
        // Tokens of a speculative block arrive without a `pick` between them.
        self.step_start = Instant::now();
        if self.last_stats.elapsed() >= STATS_PERIOD {
            self.last_stats = Instant::now();
            let _ = self.tx.send(live_stats(self.tl, session));
        }
        self.inbox.poll_during_turn() == Interrupt::None
    }

    fn judge(&mut self, draft: &Draft, logits: &BlockLogits<'_>) -> Option<Result<Outcome, String>> {
        Some(accept(self.rule, draft, logits, &mut self.sampler, &self.params))
    }
}
