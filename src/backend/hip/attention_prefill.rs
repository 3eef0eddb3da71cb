//! The fused attention of a prefill batch in fast arithmetic (kernels/attention_prefill_fast.hip):
//! one matrix-core launch in place of the exact scores → softmax → weighted values, over the same
//! rows (window ring rows, compressed rows or the indexer's selection, sinks).
//!
//! Owns the choice between the two: batches of more than one token in fast mode whose shape the
//! kernel takes. Decode steps (one token) keep the exact kernels' sequence (their fast twins, where
//! they have them), and exact mode is untouched.

use crate::backend::BackendError;
use crate::backend::arithmetic::Arithmetic;

use super::kernels::{self, AttentionInputs, AttentionShape};
use super::pass::{Pass, p0};

impl Pass<'_> {
    /// Launches the fused attention of the `n` tokens (`io`: their layer's rows) into `acts.att` and returns true,
    /// or returns false (nothing launched) where the exact sequence must run.
    pub(super) fn attention_prefill_fast(
        &self,
        shape: &AttentionShape,
        io: &AttentionInputs,
        n: u32,
    ) -> Result<bool, BackendError> {
        // The kernel's matrix tiles are laid out for 32-lane warps (gfx11/gfx12 wave32, NVIDIA);
        // a 64-lane device keeps the exact sequence.
        let wave32 = self.warp_size == 32;
        if self.arithmetic != Arithmetic::Fast || n < 2 || !wave32 || !kernels::attention_prefill_fast_fits(shape) {
            return Ok(false);
        }
        self.launch(&kernels::attention_prefill_fast(shape, p0(&self.acts.att), io, n))?;
        Ok(true)
    }
}
