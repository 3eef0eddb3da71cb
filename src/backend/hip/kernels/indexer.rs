//! Builders of kernels/indexer.hip: the indexer's scores over the compressed rows and its top-k
//! selection.

use super::abi::{Arg, DevPtr, INDEXER_SCORES, INDEXER_TOPK};
use super::launch::{Launch, blocks, f, ptr, u};

/// Compressed rows per block of `ds4_indexer_scores` (DS4_IDX_ROWS).
pub const INDEXER_ROWS: u32 = 16;

/// `ds4_indexer_scores`: scores [n_tok][score_stride] of the compressed indexer rows of the tokens
/// at pos0.. (device word `pos`) that see more than top_k rows. Grid (ceil(grid_rows/128), n_tok):
/// `grid_rows` >= the rows the batch's last token sees (n_comp_avail, or the capacity).
pub fn indexer_scores(
    scores: DevPtr,
    qi: DevPtr,
    w: DevPtr,
    krows: DevPtr,
    pos: DevPtr,
    n_head: u32,
    n_comp_avail: u32,
    ratio: u32,
    top_k: u32,
    score_stride: u32,
    w_scale: f32,
    grid_rows: u32,
    n_tok: u32,
) -> Launch {
    assert!(n_head <= 64, "indexer_scores: n_head {n_head} > 64");
    Launch::new(
        &INDEXER_SCORES,
        [blocks(grid_rows, INDEXER_ROWS), n_tok, 1],
        vec![
            ptr(scores),
            ptr(qi),
            ptr(w),
            ptr(krows),
            ptr(pos),
            u(n_head),
            u(n_comp_avail),
            u(ratio),
            u(top_k),
            u(score_stride),
            f(w_scale),
        ],
    )
}

/// The indexer's top-k selection of the tokens at pos0.. (device word `pos`) that see more than
/// top_k rows: ascending row lists sel [n_tok][top_k] from scores [n_tok][score_stride] over
/// n_comp_avail compressed rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexerTopk {
    pub sel: DevPtr,
    pub scores: DevPtr,
    pub pos: DevPtr,
    pub score_stride: u32,
    pub n_comp_avail: u32,
    pub ratio: u32,
    pub top_k: u32,
}

impl IndexerTopk {
    /// The arguments every top-k kernel starts with, in the order they share.
    pub(super) fn args(&self) -> Vec<Arg> {
        vec![
            ptr(self.sel),
            ptr(self.scores),
            ptr(self.pos),
            u(self.score_stride),
            u(self.n_comp_avail),
            u(self.ratio),
            u(self.top_k),
        ]
    }
}

/// `ds4_indexer_topk`: the selection of `topk` in one block per token. Grid (n_tok).
pub fn indexer_topk(topk: &IndexerTopk, n_tok: u32) -> Launch {
    Launch::new(&INDEXER_TOPK, [n_tok, 1, 1], topk.args())
}
