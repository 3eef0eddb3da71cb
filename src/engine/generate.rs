//! The one decode loop: pick a token (on the device when the backend can, else on the host) →
//! stop at EOS or the budget → hand the token out → evaluate it → let the caller stop. The chat
//! worker, `run` and `bench` all generate through `generate`; what differs between them (streaming
//! text, timing events, cancel polling, greedy picks that skip EOS) lives in their `Hooks`.
//!
//! Owns the step order and the device/host sampling choice. Must not know about text, events or
//! terminals.

use crate::backend::{BackendError, DevicePick, DeviceSample, DeviceSession};

use super::events::SamplingParams;
use super::prompt_cache::PromptCache;
use super::sampler::Sampler;

/// What tokens are generated on: a backend (`run`, `bench`) or a chat session (the worker).
pub trait DecodeState {
    /// Next-token logits after the last evaluated token.
    fn logits(&self) -> &[f32];
    /// The backend's device sampling (`DeviceSession::sample_on_device`).
    fn sample_on_device(&mut self, how: DeviceSample) -> Option<Result<DevicePick, BackendError>>;
    /// Evaluate one generated token.
    fn decode(&mut self, token: u32) -> Result<(), BackendError>;
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
