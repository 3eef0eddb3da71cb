//! Builders of kernels/attention.hip: scores, softmax with sinks and weighted values over the raw
//! ring and the compressed rows.

use super::abi::{ATTENTION_SCORES, ATTENTION_SOFTMAX, ATTENTION_VALUES, Arg, DevPtr};
use super::launch::{Launch, blocks, f, ptr, u};

/// Rows per block of `ds4_attention_scores` (DS4_ATT_SCORE_ROWS); heads and dims per block of
/// `ds4_attention_values` (DS4_ATT_VAL_HEADS, DS4_ATT_VAL_DIMS).
pub const ATTENTION_SCORE_ROWS: u32 = 8;
pub const ATTENTION_VAL_HEADS: u32 = 8;
pub const ATTENTION_VAL_DIMS: u32 = 64;
/// Largest head_dim of the attention kernels (DS4_ATT_MAX_DIM).
pub const ATTENTION_MAX_DIM: u32 = 512;

/// The fixed shape of one layer's attention (see kernels/attention.hip).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    pub n_head: u32,
    pub head_dim: u32,
    /// Rows of the raw ring; must be >= window + (largest batch) - 1 (docs/model.md#device-ring).
    pub ring_cap: u32,
    pub window: u32,
    /// Compression ratio (0 for dense layers).
    pub ratio: u32,
    /// Indexer top-k (used only when a selection list is passed).
    pub top_k: u32,
}

impl AttentionShape {
    /// Rows visible to the token at position p (raw + compressed, after the indexer selection when
    /// `selected`), with n_comp_avail compressed rows in the cache.
    pub fn visible_rows(&self, p: u32, n_comp_avail: u32, selected: bool) -> u32 {
        let n_raw = self.window.min(p + 1);
        // ratio 0 (dense layer): no compressed rows.
        let n_c = (p + 1).checked_div(self.ratio).map_or(0, |c| c.min(n_comp_avail));
        n_raw + if selected && n_c > self.top_k { self.top_k } else { n_c }
    }

    /// Floats of the score buffer of a batch of n_tok tokens none of which sees more than
    /// `max_rows` rows: [n_tok][n_head][max_rows] (`max_rows` is the launches' sc_stride).
    pub fn score_floats(&self, n_tok: u32, max_rows: u32) -> usize {
        n_tok as usize * self.n_head as usize * max_rows.max(1) as usize
    }

    /// The shape of a Flash ratio-4 layer (the builders' tests).
    #[cfg(test)]
    pub(super) fn flash_ratio4() -> Self {
        AttentionShape {
            n_head: 64,
            head_dim: 512,
            ring_cap: 2304,
            window: 128,
            ratio: 4,
            top_k: 512,
        }
    }
}

/// What every attention kernel reads besides its output and scratch: the batch's queries
/// q [n_tok][n_head][head_dim], the ring, the compressed rows, the indexer's [n_tok][top_k]
/// selection over them (or NULL), the sinks, the device position word and the compressed rows in
/// the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionInputs {
    pub q: DevPtr,
    pub ring: DevPtr,
    pub comp: DevPtr,
    pub comp_sel: DevPtr,
    pub sinks: DevPtr,
    pub pos: DevPtr,
    pub n_comp_avail: u32,
}

impl AttentionInputs {
    /// The words of the shape and the cache that every attention kernel takes after its pointers,
    /// in the order they share.
    pub(super) fn shape_args(&self, shape: &AttentionShape) -> [Arg; 7] {
        [
            u(shape.n_head),
            u(shape.head_dim),
            u(shape.ring_cap),
            u(shape.window),
            u(self.n_comp_avail),
            u(shape.ratio),
            u(shape.top_k),
        ]
    }

    /// The rows' pointers (ring, comp, comp_sel, pos) then [`Self::shape_args`]: the arguments
    /// the scores, the values and the split decode read the rows with.
    pub(super) fn row_args(&self, shape: &AttentionShape) -> Vec<Arg> {
        let ptrs = [ptr(self.ring), ptr(self.comp), ptr(self.comp_sel), ptr(self.pos)];
        [&ptrs[..], &self.shape_args(shape)].concat()
    }
}

/// `ds4_attention_scores`, `ds4_attention_softmax`, `ds4_attention_values`: attention of the batch
/// q at positions pos0.. (pos0 from the device word `pos`) over the ring and the compressed rows
/// ([`AttentionInputs`]), in the CPU reference's order. `max_rows` bounds the rows any token of the batch sees (the exact count when the
/// host knows the position, else the session's most): it sizes the score grid and is the stride of
/// `sc` ([`AttentionShape::score_floats`]); `inv` holds n_tok * n_head floats. Grids
/// (ceil(max_rows/8), n_tok), (n_head, n_tok), (n_head/8, head_dim/64, n_tok).
pub fn attention(
    shape: &AttentionShape,
    out: DevPtr,
    sc: DevPtr,
    inv: DevPtr,
    io: &AttentionInputs,
    max_rows: u32,
    n_tok: u32,
) -> [Launch; 3] {
    assert!(
        shape.n_head.is_multiple_of(ATTENTION_VAL_HEADS)
            && shape.head_dim.is_multiple_of(ATTENTION_VAL_DIMS)
            && shape.head_dim <= ATTENTION_MAX_DIM,
        "attention: unsupported shape {shape:?}"
    );
    let scale = 1.0 / (shape.head_dim as f32).sqrt();
    let stride = max_rows.max(1);
    // The rows the scores and the values both read and how they are selected, in the ABI order
    // both kernels share.
    let rows = [io.row_args(shape), vec![u(stride)]].concat();
    let scores = Launch::new(
        &ATTENTION_SCORES,
        [blocks(stride, ATTENTION_SCORE_ROWS), n_tok, 1],
        [&[ptr(sc), ptr(io.q)][..], &rows, &[f(scale)]].concat(),
    );
    let softmax = Launch::new(
        &ATTENTION_SOFTMAX,
        [shape.n_head, n_tok, 1],
        vec![
            ptr(sc),
            ptr(inv),
            ptr(io.sinks),
            ptr(io.comp_sel),
            ptr(io.pos),
            u(shape.n_head),
            u(shape.window),
            u(io.n_comp_avail),
            u(shape.ratio),
            u(shape.top_k),
            u(stride),
        ],
    );
    let values = Launch::new(
        &ATTENTION_VALUES,
        [
            shape.n_head / ATTENTION_VAL_HEADS,
            shape.head_dim / ATTENTION_VAL_DIMS,
            n_tok,
        ],
        [&[ptr(out), ptr(sc), ptr(inv)][..], &rows].concat(),
    );
    [scores, softmax, values]
}
