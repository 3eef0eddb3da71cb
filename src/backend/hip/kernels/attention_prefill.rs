//! Builder of kernels/attention_prefill_fast.hip: the fused attention of a batch on matrix cores
//! (fast arithmetic only), over the same rows as [`super::attention`].

use super::abi::{ATTENTION_PREFILL_FAST, DevPtr};
use super::attention::{ATTENTION_MAX_DIM, AttentionShape};
use super::launch::{Launch, f, ptr, u};

/// Heads per block of `ds4_attention_prefill_fast` (DS4_ATTF_HEADS).
pub const ATTENTION_FAST_HEADS: u32 = 32;

/// Whether `ds4_attention_prefill_fast` takes this shape (head_dim a multiple of 64, at most 512).
pub fn attention_prefill_fast_fits(shape: &AttentionShape) -> bool {
    shape.head_dim.is_multiple_of(64) && shape.head_dim <= ATTENTION_MAX_DIM && shape.n_head > 0
}

/// `ds4_attention_prefill_fast`: out [n_tok][n_head][head_dim] = the attention with sinks of the batch
/// q at positions pos0.. over the ring and the compressed rows (comp_sel: the indexer's
/// [n_tok][top_k] list or NULL), in one launch with no score buffer. Grid (ceil(n_head / 32), n_tok).
pub fn attention_prefill_fast(
    shape: &AttentionShape,
    out: DevPtr,
    q: DevPtr,
    ring: DevPtr,
    comp: DevPtr,
    comp_sel: DevPtr,
    sinks: DevPtr,
    pos: DevPtr,
    n_comp_avail: u32,
    n_tok: u32,
) -> Launch {
    assert!(
        attention_prefill_fast_fits(shape),
        "attention_prefill_fast: unsupported shape {shape:?}"
    );
    Launch::new(
        &ATTENTION_PREFILL_FAST,
        [shape.n_head.div_ceil(ATTENTION_FAST_HEADS), n_tok, 1],
        vec![
            ptr(out),
            ptr(q),
            ptr(ring),
            ptr(comp),
            ptr(comp_sel),
            ptr(sinks),
            ptr(pos),
            u(shape.n_head),
            u(shape.head_dim),
            u(shape.ring_cap),
            u(shape.window),
            u(n_comp_avail),
            u(shape.ratio),
            u(shape.top_k),
            f(1.0 / (shape.head_dim as f32).sqrt()),
        ],
    )
}
