//! The backend side of the DSpark drafter (docs/dspark.md): what a backend offers the engine's
//! drafter (`engine::speculate::dspark`) once `DeviceSession::dspark` attached it to a session.
//!
//! Owns the narrow boundary only: run the drafter's stages for one block, then read each draft row's
//! confidence and Markov-biased greedy token lazily, row by row, so the engine decides where the
//! confidence cut falls and the LM head runs only for rows that pass it. Must not decide how many
//! tokens are proposed.

use super::BackendError;
use crate::model::dspark::PassReads;

/// The drafter's forward over one session's model and captured target rows.
pub trait DsparkForward: Send {
    /// Draft rows of a block (the support file's block size).
    fn block_size(&self) -> usize;
    /// Run the stages for a block whose anchor `anchor` sits at position `pos` (the token after the
    /// last evaluated one: `pos` is the session's `n_past`). `Ok(false)` when the target row of
    /// `pos - 1` was not captured: there is nothing to condition on and no row may be read.
    fn run_block(&mut self, anchor: u32, pos: usize) -> Result<bool, BackendError>;
    /// The confidence (a probability) that draft row `row` of the last block is right, when the
    /// token before it is `prev` (the anchor for row 0, else the previous row's token).
    fn confidence(&mut self, row: usize, prev: u32) -> f32;
    /// Draft row `row`'s token after `prev`: the argmax of its LM-head logits plus the Markov bias of
    /// `prev`, the lowest id among equal maxima.
    fn token(&mut self, row: usize, prev: u32) -> u32;
    /// What the last block read so far (the distinct experts of each stage, whether the LM head
    /// ran, the Markov and confidence rows), for its byte count (`model::dspark::pass_bytes`).
    fn reads(&self) -> PassReads;
    /// Forget what was derived from captured rows (their context-KV rows): after a rollback or a
    /// history rewritten from an earlier position.
    fn reset(&mut self);
}

/// The error of a backend without a DSpark drafter (`DeviceSession::dspark`).
pub fn no_dspark(backend: &str) -> BackendError {
    BackendError::Other(format!("the {backend} backend has no DSpark drafter yet"))
}
