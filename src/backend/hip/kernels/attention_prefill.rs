//! Builder of kernels/attention_prefill_fast.hip: the fused attention of a batch on matrix cores
//! (fast arithmetic only), over the same rows as [`super::attention`].

use super::abi::{ATTENTION_PREFILL_FAST, DevPtr};
use super::attention::{ATTENTION_MAX_DIM, AttentionInputs, AttentionShape};
use super::launch::{Launch, f, ptr};

/// Heads per block of `ds4_attention_prefill_fast` (DS4_ATTF_HEADS).
pub const ATTENTION_FAST_HEADS: u32 = 32;

/// Whether `ds4_attention_prefill_fast` takes this shape (head_dim a multiple of 64, at most 512).
pub fn attention_prefill_fast_fits(shape: &AttentionShape) -> bool {
    shape.head_dim.is_multiple_of(64) && shape.head_dim <= ATTENTION_MAX_DIM && shape.n_head > 0
}

/// `ds4_attention_prefill_fast`: out [n_tok][n_head][head_dim] = the attention with sinks of the batch
/// q at positions pos0.. over the ring and the compressed rows ([`AttentionInputs`]), in one launch
/// with no score buffer. Grid (ceil(n_head / 32), n_tok).
pub fn attention_prefill_fast(shape: &AttentionShape, out: DevPtr, io: &AttentionInputs, n_tok: u32) -> Launch {
    assert!(
        attention_prefill_fast_fits(shape),
        "attention_prefill_fast: unsupported shape {shape:?}"
    );
    Launch::new(
        &ATTENTION_PREFILL_FAST,
        [shape.n_head.div_ceil(ATTENTION_FAST_HEADS), n_tok, 1],
        [
            &[
                ptr(out),
                ptr(io.q),
                ptr(io.ring),
                ptr(io.comp),
                ptr(io.comp_sel),
                ptr(io.sinks),
                ptr(io.pos),
            ][..],
            &io.shape_args(shape),
            &[f(1.0 / (shape.head_dim as f32).sqrt())],
        ]
        .concat(),
    )
}
