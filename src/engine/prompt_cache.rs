//! The prompt cache over one device session (docs/model.md#checkpoints): the live token list that
//! mirrors the session's cache, prefix reuse when a new prompt extends what is cached, and checkpoints at turn
//! boundaries so an edited or retried conversation restores the longest saved prefix instead of
//! prefilling again.
//!
//! Owns the token bookkeeping and the checkpoint list; the math and the cache format belong to the
//! backend (`DeviceSession::save_state` / `load_state`). Must not know about text, chat templates or sampling.

use crate::backend::cache_rows::CacheRows;
use crate::backend::{BackendError, DevicePick, DeviceSample, DeviceSession, Progress};

/// A saved backend state and the exact token prefix it holds.
struct Checkpoint {
    tokens: Vec<u32>,
    state: Vec<u8>,
}

/// What `sync` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Tokens already in the cache (live prefix or restored checkpoint) and not evaluated again.
    pub reused: usize,
    /// Tokens evaluated by this call.
    pub evaluated: usize,
    /// The cache came from a checkpoint.
    pub restored: bool,
}

/// The tokens a `DeviceSession`'s cache holds and the turn-boundary checkpoints of it (the worker's
/// "live session"; not a saved chat, which is `crate::sessions`).
pub struct PromptCache {
    backend: Box<dyn DeviceSession>,
    tokens: Vec<u32>,
    checkpoints: Vec<Checkpoint>,
    max_checkpoints: usize,
    /// The block of the last `verify`, until `commit` says how much of it the cache keeps.
    block: Vec<u32>,
}

impl PromptCache {
    /// `max_checkpoints`: how many turn-boundary states to keep (oldest dropped first; 0 = none).
    /// A Flash checkpoint holds every compressed row, so it can be hundreds of MB at long contexts.
    pub fn new(mut backend: Box<dyn DeviceSession>, max_checkpoints: usize) -> PromptCache {
        backend.reset();
        PromptCache {
            backend,
            tokens: Vec::new(),
            checkpoints: Vec::new(),
            max_checkpoints,
            block: Vec::new(),
        }
    }

    pub fn backend(&self) -> &dyn DeviceSession {
        self.backend.as_ref()
    }

    /// The session, to attach a drafter to it (`DeviceSession::dspark`).
    pub fn backend_mut(&mut self) -> &mut dyn DeviceSession {
        self.backend.as_mut()
    }

    pub fn ctx(&self) -> usize {
        self.backend.ctx()
    }

    /// Tokens in the cache, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Next-token logits after the last token (meaningless while `tokens()` is empty).
    pub fn logits(&self) -> &[f32] {
        self.backend.logits()
    }

    /// The backend's device sampling from the last step's logits (`DeviceSession::sample_on_device`;
    /// the cache is unchanged).
    pub fn sample_on_device(&mut self, how: DeviceSample) -> Option<Result<DevicePick, BackendError>> {
        self.backend.sample_on_device(how)
    }

    /// Number of checkpoints held.
    pub fn checkpoints(&self) -> usize {
        self.checkpoints.len()
    }

    /// Make the cache hold exactly `prompt`: evaluate only what the live tokens (or else the longest
    /// checkpoint that is a prefix of `prompt`) lack; otherwise start over. Afterwards the state is
    /// saved as a turn-boundary checkpoint. On `Cancelled { done }` the cache holds the prefix that
    /// was evaluated (`tokens()` says which).
    pub fn sync(&mut self, prompt: &[u32], progress: Progress<'_>) -> Result<SyncReport, BackendError> {
        if prompt.len() >= self.backend.ctx() {
            return Err(BackendError::ContextFull {
                needed: prompt.len(),
                ctx: self.backend.ctx(),
            });
        }
        let mut report = SyncReport::default();
        if !prompt.starts_with(&self.tokens) {
            self.restore_best(prompt, &mut report)?;
        }
        report.reused = self.tokens.len();
        let suffix = &prompt[self.tokens.len()..];
        report.evaluated = suffix.len();
        self.eval_tracked(suffix, progress)?;
        if report.evaluated > 0 {
            self.checkpoint();
        }
        Ok(report)
    }

    /// Evaluate one more token (generation).
    pub fn decode(&mut self, token: u32) -> Result<(), BackendError> {
        self.eval_tracked(&[token], &mut |_, _| true)
    }

    /// Whether the backend has a block verify (`DeviceSession::has_block_verify`).
    pub fn has_block_verify(&self) -> bool {
        self.backend.has_block_verify()
    }

    /// Evaluate a block of tokens in one verify pass (`DeviceSession::verify`); `commit` then says
    /// how many of them the cache keeps.
    pub fn verify(&mut self, block: &[u32]) -> Result<(), BackendError> {
        self.block.clear();
        self.backend.verify(block)?;
        self.block.extend_from_slice(block);
        Ok(())
    }

    /// The logits after every token of the verified block.
    pub fn block_logits(&self) -> &[f32] {
        self.backend.block_logits()
    }

    /// Keep the first `keep` tokens of the verified block (`DeviceSession::commit`).
    pub fn commit(&mut self, keep: usize) -> Result<(), BackendError> {
        self.backend.commit(keep)?;
        let kept = keep.min(self.block.len());
        self.tokens.extend_from_slice(&self.block[..kept]);
        self.block.clear();
        Ok(())
    }

    /// Keep only the first `keep_tokens` tokens. The backend cannot drop cache rows, so the shorter
    /// state is rebuilt: from the longest checkpoint that is a prefix of it, else from scratch, then
    /// the remaining kept tokens are evaluated.
    pub fn rewind(&mut self, keep_tokens: usize, progress: Progress<'_>) -> Result<(), BackendError> {
        if keep_tokens >= self.tokens.len() {
            return Ok(());
        }
        let keep: Vec<u32> = self.tokens[..keep_tokens].to_vec();
        let mut report = SyncReport::default();
        self.restore_best(&keep, &mut report)?;
        let suffix = keep[self.tokens.len()..].to_vec();
        self.eval_tracked(&suffix, progress)
    }

    /// The cache as backend-neutral rows (for a KV snapshot; the tokens are `tokens()`).
    pub fn export(&self) -> Result<CacheRows, BackendError> {
        self.backend.export_cache()
    }

    /// Start over from `rows` holding `tokens` (a KV snapshot, maybe from another backend). On
    /// failure the session is empty.
    pub fn restore(&mut self, tokens: &[u32], rows: &CacheRows) -> Result<(), BackendError> {
        self.reset();
        if let Err(e) = self.backend.import_cache(rows, tokens) {
            self.backend.reset();
            return Err(e);
        }
        self.tokens = tokens.to_vec();
        Ok(())
    }

    /// Drop the cache and every checkpoint.
    pub fn reset(&mut self) {
        self.backend.reset();
        self.tokens.clear();
        self.checkpoints.clear();
    }

    /// Save the current state as a checkpoint (also done automatically at the end of `sync`).
    pub fn checkpoint(&mut self) {
        if self.max_checkpoints == 0 || self.tokens.is_empty() {
            return;
        }
        self.checkpoints.retain(|c| c.tokens != self.tokens);
        if self.checkpoints.len() == self.max_checkpoints {
            self.checkpoints.remove(0);
        }
        self.checkpoints.push(Checkpoint {
            tokens: self.tokens.clone(),
            state: self.backend.save_state(),
        });
    }

    /// Load the longest checkpoint that is a prefix of `want`, or leave the session empty.
    fn restore_best(&mut self, want: &[u32], report: &mut SyncReport) -> Result<(), BackendError> {
        let best = self
            .checkpoints
            .iter()
            .enumerate()
            .filter(|(_, c)| want.starts_with(&c.tokens))
            .max_by_key(|(_, c)| c.tokens.len())
            .map(|(i, _)| i);
        self.tokens.clear();
        if let Some(i) = best {
            let c = &self.checkpoints[i];
            match self.backend.load_state(&c.state) {
                Ok(()) => {
                    self.tokens = c.tokens.clone();
                    report.restored = true;
                }
                Err(e) => {
                    // A checkpoint that no longer loads is useless: drop it and start over.
                    self.checkpoints.remove(i);
                    self.backend.reset();
                    if !matches!(e, BackendError::BadCheckpoint(_)) {
                        return Err(e);
                    }
                }
            }
        } else {
            self.backend.reset();
        }
        Ok(())
    }

    /// Evaluate and keep `tokens` equal to the backend's cache, also when cancelled or failing.
    fn eval_tracked(&mut self, toks: &[u32], progress: Progress<'_>) -> Result<(), BackendError> {
        if toks.is_empty() {
            return Ok(());
        }
        let before = self.tokens.len();
        let r = self.backend.eval(toks, progress);
        let done = self.backend.n_past().saturating_sub(before).min(toks.len());
        self.tokens.extend_from_slice(&toks[..done]);
        r
    }
}
