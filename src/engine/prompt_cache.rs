//! The prompt cache over one device session (docs/model.md#checkpoints): the live token list that
//! mirrors the session's cache, prefix reuse when a new prompt extends what is cached, and checkpoints at turn
//! boundaries so an edited or retried conversation restores the longest saved prefix instead of
//! prefilling again.
//!
//! With a prompt store (`prompt_store`, serve's prompt cache on disk) a prompt also starts from the
//! longest prefix stored there when that is longer than what the session and its checkpoints hold;
//! `sync_marked` stages the state at a marked length (the end of the prompt's shared part) and
//! `persist` writes it and the turn's end state to the store.
//!
//! Owns the token bookkeeping and the checkpoint list; the math and the cache format belong to the
//! backend (`DeviceSession::save_state` / `load_state`). Must not know about text, chat templates or sampling.

use crate::backend::cache_rows::CacheRows;
use crate::backend::{BackendError, DevicePick, DeviceSample, DeviceSession, Progress};

use super::prompt_store::{MIN_STORED_TOKENS, PromptStore, StoredKind};

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
    /// The cache came from a checkpoint (in memory or the prompt store's on disk).
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
    /// The prompt store on disk, when the client keeps one (serve).
    store: Option<PromptStore>,
    /// States `sync_marked` set aside for the store; `persist` writes them.
    staged: Vec<(Vec<u32>, CacheRows)>,
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
            store: None,
            staged: Vec::new(),
        }
    }

    /// Use `store` for the prompts that follow (None: none).
    pub fn set_store(&mut self, store: Option<PromptStore>) {
        self.store = store;
        self.staged.clear();
    }

    pub fn store(&self) -> Option<&PromptStore> {
        self.store.as_ref()
    }

    /// The store's notices since the last call (files skipped, writes that failed).
    pub fn take_store_notices(&mut self) -> Vec<String> {
        self.store.as_mut().map(|s| s.take_notices()).unwrap_or_default()
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
        self.sync_marked(prompt, None, progress)
    }

    /// `sync`, also starting from the prompt store's longest prefix of `prompt` when that is longer
    /// than the live tokens and the checkpoints give; and when a store is kept and `mark` (a
    /// length) falls in what is evaluated, the state after `mark` tokens is staged for `persist`.
    pub fn sync_marked(
        &mut self,
        prompt: &[u32],
        mark: Option<usize>,
        progress: Progress<'_>,
    ) -> Result<SyncReport, BackendError> {
        if prompt.len() >= self.backend.ctx() {
            return Err(BackendError::ContextFull {
                needed: prompt.len(),
                ctx: self.backend.ctx(),
            });
        }
        let mut report = SyncReport::default();
        let live = if prompt.starts_with(&self.tokens) {
            self.tokens.len()
        } else {
            0
        };
        let checkpoint = self.best_checkpoint(prompt).map_or(0, |(_, n)| n);
        let stored = self.store.as_ref().map_or(0, |s| s.longest_prefix(prompt));
        let from_store = stored > live.max(checkpoint) && self.restore_stored(prompt, stored, &mut report);
        // (A store file that failed to import left the session empty: a checkpoint beats nothing.)
        if !from_store && (!prompt.starts_with(&self.tokens) || (self.tokens.is_empty() && checkpoint > 0)) {
            self.restore_best(prompt, &mut report)?;
        }
        report.reused = self.tokens.len();
        report.evaluated = prompt.len() - self.tokens.len();
        self.staged.clear();
        let mark = mark.filter(|&m| {
            m > self.tokens.len()
                && m < prompt.len()
                && m >= MIN_STORED_TOKENS
                && self.store.as_ref().is_some_and(|s| !s.contains(&prompt[..m]))
        });
        if let Some(m) = mark {
            let (start, total) = (self.tokens.len(), report.evaluated);
            self.eval_tracked(&prompt[start..m], &mut |done, _| progress(done, total))?;
            // A state that does not export is only not stored.
            if let Ok(rows) = self.backend.export_cache() {
                self.staged.push((prompt[..m].to_vec(), rows));
            }
            let before = m - start;
            let suffix = &prompt[m..];
            self.eval_tracked(suffix, &mut |done, _| progress(before + done, total))?;
        } else {
            let suffix = &prompt[self.tokens.len()..];
            self.eval_tracked(suffix, progress)?;
        }
        if report.evaluated > 0 {
            self.checkpoint();
        }
        Ok(report)
    }

    /// Start from the store's state of `prompt[..n]`; false when the file does not read (the
    /// session unchanged) or its rows do not import (the session empty), with a notice.
    fn restore_stored(&mut self, prompt: &[u32], n: usize, report: &mut SyncReport) -> bool {
        let Some(store) = self.store.as_mut() else { return false };
        let Some(rows) = store.load(prompt, n) else {
            return false;
        };
        let tokens = &prompt[..n];
        if let Err(e) = self.backend.import_cache(&rows, tokens) {
            // The session is unknown now: start it over.
            self.backend.reset();
            self.tokens.clear();
            store.push_notice(format!("prompt cache: a stored prefix of {n} tokens did not load: {e}"));
            return false;
        }
        self.tokens = tokens.to_vec();
        report.restored = true;
        true
    }

    /// Write the staged states (prefix boundaries) and the current one (the turn's end) to the
    /// store, if one is kept. Call after a turn: the writes are off the turn's path.
    pub fn persist(&mut self) {
        let Some(store) = self.store.as_mut() else { return };
        for (tokens, rows) in self.staged.drain(..) {
            store.save(&tokens, &rows, StoredKind::Prefix);
        }
        if self.tokens.len() < MIN_STORED_TOKENS || store.contains(&self.tokens) {
            return;
        }
        match self.backend.export_cache() {
            Ok(rows) => store.save(&self.tokens, &rows, StoredKind::Turn),
            Err(e) => store.push_notice(format!("prompt cache: cannot export the session: {e}")),
        }
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

    /// The longest checkpoint that is a prefix of `want`: its index and length.
    fn best_checkpoint(&self, want: &[u32]) -> Option<(usize, usize)> {
        self.checkpoints
            .iter()
            .enumerate()
            .filter(|(_, c)| want.starts_with(&c.tokens))
            .map(|(i, c)| (i, c.tokens.len()))
            .max_by_key(|&(_, n)| n)
    }

    /// Load the longest checkpoint that is a prefix of `want`, or leave the session empty.
    fn restore_best(&mut self, want: &[u32], report: &mut SyncReport) -> Result<(), BackendError> {
        let best = self.best_checkpoint(want).map(|(i, _)| i);
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
