//! The one decode loop: pick a token (on the device when the backend can, else on the host) →
//! stop at EOS or the budget → hand the token out → evaluate it → let the caller stop. The chat
//! worker, `run` and `bench` all generate through `generate`; what differs between them (streaming
//! text, timing events, cancel polling, greedy picks that skip EOS) lives in their `Hooks`.
//!
//! `generate_speculative` is the same loop with speculative decoding (docs/speculative.md): a
//! drafter proposes tokens after the one just handed out, one block verify checks them all, the
//! acceptance rule keeps a prefix, and the kept tokens go out one by one through the same hooks and
//! stop checks; generation that stops inside a block commits only what was handed out.
//!
//! Owns the step order and the device/host sampling choice. Must not know about text, events or
//! terminals.

use std::time::Instant;

use crate::backend::{BackendError, DevicePick, DeviceSample, DeviceSession};

use super::events::SamplingParams;
use super::prompt_cache::PromptCache;
use super::sampler::Sampler;
use super::speculate::accept::{BlockLogits, Outcome};
use super::speculate::drafter::{Draft, Drafter, Verdict};
use super::speculate::schedule::DraftScheduler;

/// What tokens are generated on: a backend (`run`, `bench`) or a chat session (the worker).
pub trait DecodeState {
    /// Next-token logits after the last evaluated token.
    fn logits(&self) -> &[f32];
    /// The backend's device sampling (`DeviceSession::sample_on_device`).
    fn sample_on_device(&mut self, how: DeviceSample) -> Option<Result<DevicePick, BackendError>>;
    /// Evaluate one generated token.
    fn decode(&mut self, token: u32) -> Result<(), BackendError>;
    /// Tokens the cache still has room for.
    fn room(&self) -> usize;
    /// Whether `verify` and `commit` work here (`DeviceSession::has_block_verify`).
    fn has_block_verify(&self) -> bool {
        false
    }
    /// Evaluate a block, keeping what it overwrites (`DeviceSession::verify`).
    fn verify(&mut self, tokens: &[u32]) -> Result<(), BackendError> {
        let _ = tokens;
        Err(BackendError::Other("no block verify here".into()))
    }
    /// The logits after every token of the verified block.
    fn block_logits(&self) -> &[f32] {
        &[]
    }
    /// Keep the first `keep` tokens of the verified block (`DeviceSession::commit`).
    fn commit(&mut self, keep: usize) -> Result<(), BackendError> {
        let _ = keep;
        Err(BackendError::Other("no block verify here".into()))
    }
}

impl<'b> DecodeState for dyn DeviceSession + 'b {
    fn logits(&self) -> &[f32] {
        DeviceSession::logits(self)
    }
    fn sample_on_device(&mut self, how: DeviceSample) -> Option<Result<DevicePick, BackendError>> {
        DeviceSession::sample_on_device(self, how)
    }
    fn decode(&mut self, token: u32) -> Result<(), BackendError> {
        self.eval(&[token], &mut |_, _| true)
    }
    fn room(&self) -> usize {
        self.ctx().saturating_sub(self.n_past())
    }
    fn has_block_verify(&self) -> bool {
        DeviceSession::has_block_verify(self)
    }
    fn verify(&mut self, tokens: &[u32]) -> Result<(), BackendError> {
        DeviceSession::verify(self, tokens)
    }
    fn block_logits(&self) -> &[f32] {
        DeviceSession::block_logits(self)
    }
    fn commit(&mut self, keep: usize) -> Result<(), BackendError> {
        DeviceSession::commit(self, keep)
    }
}

impl DecodeState for PromptCache {
    fn logits(&self) -> &[f32] {
        PromptCache::logits(self)
    }
    fn sample_on_device(&mut self, how: DeviceSample) -> Option<Result<DevicePick, BackendError>> {
        PromptCache::sample_on_device(self, how)
    }
    fn decode(&mut self, token: u32) -> Result<(), BackendError> {
        PromptCache::decode(self, token)
    }
    fn room(&self) -> usize {
        self.ctx().saturating_sub(self.tokens().len())
    }
    fn has_block_verify(&self) -> bool {
        PromptCache::has_block_verify(self)
    }
    fn verify(&mut self, tokens: &[u32]) -> Result<(), BackendError> {
        PromptCache::verify(self, tokens)
    }
    fn block_logits(&self) -> &[f32] {
        PromptCache::block_logits(self)
    }
    fn commit(&mut self, keep: usize) -> Result<(), BackendError> {
        PromptCache::commit(self, keep)
    }
}

/// The next token under `params`: on the device when the backend can pick there (only the id comes
/// back), else on the host from the logits; the generator advances the same either way.
pub fn sample_next<S: DecodeState + ?Sized>(
    state: &mut S,
    sampler: &mut Sampler,
    params: &SamplingParams,
) -> Result<u32, BackendError> {
    if let Some(req) = sampler.device_request(params)
        && let Some(pick) = state.sample_on_device(req.how)
    {
        return Ok(sampler.accept_device(req, pick?));
    }
    Ok(sampler.sample(state.logits(), params))
}

/// When generation ends.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most tokens handed out.
    pub max_new: usize,
    /// This token ends generation and is not handed out (EOS); `None` never stops.
    pub stop_token: Option<u32>,
    /// Evaluate the last token of the budget too (a session keeps it for the next turn); without,
    /// its logits are never needed and the evaluation is skipped.
    pub decode_last: bool,
}

/// Why `generate` ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The stop token was picked.
    Eos,
    /// `max_new` tokens were handed out.
    Budget,
    /// `Hooks::decoded` asked to stop (a cancel).
    Halted,
}

/// A step that failed: sampling, evaluation, or the caller's hook (e.g. writing output).
#[derive(Debug)]
pub enum GenerateError {
    Sample(BackendError),
    Decode(BackendError),
    Hook(String),
}

impl std::fmt::Display for GenerateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GenerateError::Sample(e) => write!(f, "sampling failed: {e}"),
            GenerateError::Decode(e) => write!(f, "decode failed: {e}"),
            GenerateError::Hook(e) => f.write_str(e),
        }
    }
}

/// What a caller does at each step.
pub trait Hooks<S: ?Sized> {
    /// Pick the next token (usually `sample_next`); called for every step, the stop token included.
    fn pick(&mut self, state: &mut S) -> Result<u32, BackendError>;
    /// A generated token, before it is evaluated (stream it out here).
    fn token(&mut self, token: u32) -> Result<(), String>;
    /// The step that handed out the `generated`-th token is done; false stops generation.
    fn decoded(&mut self, _state: &S, _generated: usize) -> bool {
        true
    }
    /// Judge a verified block of drafts (`speculate::accept::accept` with the hooks' sampler and
    /// settings): the row i of `logits` follows the token before the drafts and the first i drafts.
    /// `None`: these hooks do not speculate, and `generate_speculative` decodes plainly.
    fn judge(&mut self, _draft: &Draft, _logits: &BlockLogits<'_>) -> Option<Result<Outcome, String>> {
        None
    }
}

/// Generate up to `limits.max_new` tokens from the evaluated state in `state`. Returns how many
/// tokens were handed out and why it stopped.
pub fn generate<S: DecodeState + ?Sized>(
    state: &mut S,
    limits: Limits,
    hooks: &mut dyn Hooks<S>,
) -> Result<(usize, Stop), GenerateError> {
    for generated in 0..limits.max_new {
        let token = hooks.pick(state).map_err(GenerateError::Sample)?;
        if Some(token) == limits.stop_token {
            return Ok((generated, Stop::Eos));
        }
        hooks.token(token).map_err(GenerateError::Hook)?;
        if limits.decode_last || generated + 1 < limits.max_new {
            state.decode(token).map_err(GenerateError::Decode)?;
        }
        if !hooks.decoded(state, generated + 1) {
            return Ok((generated + 1, Stop::Halted));
        }
    }
    Ok((limits.max_new, Stop::Budget))
}

/// The largest draft per cycle (a block of one more token than this).
pub const MAX_DRAFT: usize = 5;

/// What speculation did over one generation (docs/speculative.md#figures).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpeculationFigures {
    /// Block verifies run.
    pub cycles: usize,
    /// Tokens the drafter proposed into verified blocks.
    pub drafted: usize,
    /// Drafts the acceptance rule kept (handed out or not).
    pub accepted: usize,
    /// Tokens the verifies committed (the token before the drafts plus the kept drafts).
    pub committed: usize,
}

impl SpeculationFigures {
    /// Tokens committed per verify cycle; 0 without cycles.
    pub fn tokens_per_cycle(&self) -> f64 {
        if self.cycles == 0 {
            0.0
        } else {
            self.committed as f64 / self.cycles as f64
        }
    }
}

/// A session's speculative decoding state: its drafter, the draft-length policy and the token
/// history the drafter reads.
pub struct Speculation {
    drafter: Box<dyn Drafter>,
    scheduler: DraftScheduler,
    /// Draft this many tokens every cycle instead of asking the scheduler (benchmarks and tests of
    /// the loop itself: losslessness holds for any draft length).
    fixed_len: Option<usize>,
    history: Vec<u32>,
    draft: Draft,
    block: Vec<u32>,
    pub figures: SpeculationFigures,
}

impl Speculation {
    /// Speculation with `drafter` after `history` (the evaluated tokens: prompt and output so far).
    pub fn new(drafter: Box<dyn Drafter>, history: &[u32]) -> Speculation {
        Speculation {
            drafter,
            scheduler: DraftScheduler::new(MAX_DRAFT),
            fixed_len: None,
            history: history.to_vec(),
            draft: Draft::default(),
            block: Vec::new(),
            figures: SpeculationFigures::default(),
        }
    }

    /// Draft `len` tokens (at most `MAX_DRAFT`) every cycle, bypassing the scheduler.
    pub fn with_fixed_len(mut self, len: usize) -> Speculation {
        self.fixed_len = Some(len.min(MAX_DRAFT));
        self
    }

    /// The drafter back (to go on drafting for the same session in a later generation).
    pub fn into_drafter(self) -> Box<dyn Drafter> {
        self.drafter
    }

    /// The history the drafter reads: the starting tokens and every token handed out since.
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    fn next_len(&mut self) -> usize {
        self.fixed_len.unwrap_or_else(|| self.scheduler.next_len())
    }
}

/// `generate` with speculative decoding through `spec`. The tokens handed out and every stop are
/// plain decoding's whenever the acceptance rule is lossless (greedy, exact speculative sampling)
/// and the backend's verify is bitwise its decode. Where the state has no block verify or the
/// hooks do not judge blocks, this is plain `generate`.
pub fn generate_speculative<S: DecodeState + ?Sized>(
    state: &mut S,
    limits: Limits,
    hooks: &mut dyn Hooks<S>,
    spec: &mut Speculation,
) -> Result<(usize, Stop), GenerateError> {
    let mut generated = 0;
    // The token the last cycle's acceptance rule chose; it is the next token handed out.
    let mut pending: Option<u32> = None;
    let mut speculate = state.has_block_verify();
    while generated < limits.max_new {
        let token = match pending.take() {
            Some(t) => t,
            None => hooks.pick(state).map_err(GenerateError::Sample)?,
        };
        if Some(token) == limits.stop_token {
            return Ok((generated, Stop::Eos));
        }
        hooks.token(token).map_err(GenerateError::Hook)?;
        spec.history.push(token);
        generated += 1;
        if !(limits.decode_last || generated < limits.max_new) {
            break;
        }
        // Drafts never run past the budget (the block's last draft is the budget's last token) or
        // the cache.
        let left = limits.max_new - generated;
        let fits = state.room().saturating_sub(1);
        let k = if speculate {
            spec.next_len().min(left).min(fits)
        } else {
            0
        };
        // A verify's time includes its draft pass (a model drafter's is not free).
        let t = Instant::now();
        if k > 0 {
            spec.drafter.propose(&spec.history, k, &mut spec.draft);
            spec.draft.truncate(k);
        } else {
            spec.draft.clear();
        }
        if spec.draft.is_empty() {
            let t = Instant::now();
            state.decode(token).map_err(GenerateError::Decode)?;
            spec.scheduler.record_plain(t.elapsed().as_secs_f64());
            if !hooks.decoded(state, generated) {
                return Ok((generated, Stop::Halted));
            }
            continue;
        }
        spec.block.clear();
        spec.block.push(token);
        spec.block.extend_from_slice(&spec.draft.tokens);
        state.verify(&spec.block).map_err(GenerateError::Decode)?;
        let vocab = state.logits().len();
        let verdict = BlockLogits::new(state.block_logits(), vocab)
            .map_err(GenerateError::Hook)
            .and_then(|logits| {
                hooks
                    .judge(&spec.draft, &logits)
                    .transpose()
                    .map_err(GenerateError::Hook)
            })?;
        let Some(outcome) = verdict else {
            // These hooks do not judge blocks: take the token alone and decode plainly from now on.
            state.commit(1).map_err(GenerateError::Decode)?;
            speculate = false;
            if !hooks.decoded(state, generated) {
                return Ok((generated, Stop::Halted));
            }
            continue;
        };
        let drafted = spec.draft.len();
        let m = outcome.accepted.min(drafted);
        spec.scheduler.record_verify(drafted, m, t.elapsed().as_secs_f64());
        spec.drafter.observe(&Verdict {
            proposed: drafted,
            accepted: m,
            next: outcome.next,
            hidden: None,
        });
        spec.figures.cycles += 1;
        spec.figures.drafted += drafted;
        spec.figures.accepted += m;
        // Hand the kept drafts out one by one; `kept` counts the block tokens the cache keeps.
        let mut kept = 1;
        let mut stop = None;
        if !hooks.decoded(state, generated) {
            stop = Some(Stop::Halted);
        }
        for i in 0..m {
            if stop.is_some() {
                break;
            }
            let d = spec.draft.tokens[i];
            if Some(d) == limits.stop_token {
                stop = Some(Stop::Eos);
                break;
            }
            hooks.token(d).map_err(GenerateError::Hook)?;
            spec.history.push(d);
            generated += 1;
            if limits.decode_last || generated < limits.max_new {
                kept += 1;
            }
            if !hooks.decoded(state, generated) {
                stop = Some(Stop::Halted);
            }
        }
        state.commit(kept).map_err(GenerateError::Decode)?;
        spec.figures.committed += kept;
        match stop {
            Some(s) => return Ok((generated, s)),
            None if kept == 1 + m => pending = Some(outcome.next),
            // The budget ended inside the block.
            None => break,
        }
    }
    Ok((generated, Stop::Budget))
}
