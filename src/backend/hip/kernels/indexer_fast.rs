//! Builders of kernels/indexer_fast.hip: the indexer's top-k selection in two launches (a block
//! per segment of scores, then a merge of the segments' candidates), the fast arithmetic's
//! replacement of `ds4_indexer_topk` for long contexts.

use super::abi::{DevPtr, INDEXER_TOPK_MERGE, INDEXER_TOPK_SEGMENTS};
use super::launch::{Launch, ptr, u};

/// Rows per segment of `ds4_indexer_topk_segments` (at most 4096: a segment and the remainder
/// it may take are staged in 32 KiB of shared memory).
pub const INDEXER_TOPK_SEGMENT: u32 = 4096;

/// `ds4_indexer_topk_segments` then `ds4_indexer_topk_merge`: the list of `indexer_topk` (same
/// arguments) for the tokens at pos0.. that see more than top_k rows, with segments of `seg` rows;
/// the scores of tokens with more than one segment are overwritten. `grid_rows` >= the rows the
/// batch's last token sees. `None` when seg misses the kernels' bounds (2 top_k <= seg <= 4096).
/// Grids (max(1, grid_rows / seg), n_tok) and (n_tok).
pub fn indexer_topk_segmented(
    sel: DevPtr,
    scores: DevPtr,
    pos: DevPtr,
    score_stride: u32,
    n_comp_avail: u32,
    ratio: u32,
    top_k: u32,
    seg: u32,
    grid_rows: u32,
    n_tok: u32,
) -> Option<[Launch; 2]> {
    if top_k == 0 || seg < 2 * top_k || seg > INDEXER_TOPK_SEGMENT {
        return None;
    }
    let args = vec![
        ptr(sel),
        ptr(scores),
        ptr(pos),
        u(score_stride),
        u(n_comp_avail),
        u(ratio),
        u(top_k),
        u(seg),
    ];
    let segments = Launch::new(
        &INDEXER_TOPK_SEGMENTS,
        [(grid_rows / seg).max(1), n_tok, 1],
        args.clone(),
    );
    let merge = Launch::new(&INDEXER_TOPK_MERGE, [n_tok, 1, 1], args);
    Some([segments, merge])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_the_rows_and_bound_the_segment() {
        let [s, m] = indexer_topk_segmented(1, 2, 3, 262144, 262144, 4, 512, 4096, 262144, 1).unwrap();
        assert_eq!((s.grid, m.grid), ([64, 1, 1], [1, 1, 1]));
        // The remainder joins the last segment; a short context has one.
        let [s, _] = indexer_topk_segmented(1, 2, 3, 9000, 9000, 4, 512, 4096, 9000, 2).unwrap();
        assert_eq!(s.grid, [2, 2, 1]);
        let [s, _] = indexer_topk_segmented(1, 2, 3, 600, 600, 4, 512, 4096, 600, 1).unwrap();
        assert_eq!(s.grid, [1, 1, 1]);
        assert!(indexer_topk_segmented(1, 2, 3, 600, 600, 4, 512, 1000, 600, 1).is_none());
        assert!(indexer_topk_segmented(1, 2, 3, 600, 600, 4, 512, 8192, 600, 1).is_none());
    }
}
