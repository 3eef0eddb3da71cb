//! Builders of kernels/indexer_fast.hip: the indexer's top-k selection in two launches (a block
//! per segment of scores, then a merge of the segments' candidates), the fast arithmetic's
//! replacement of `ds4_indexer_topk` for long contexts.

use super::abi::{INDEXER_TOPK_MERGE, INDEXER_TOPK_SEGMENTS};
use super::indexer::IndexerTopk;
use super::launch::{Launch, u};

/// Rows per segment of `ds4_indexer_topk_segments` (at most 4096: a segment and the remainder
/// it may take are staged in 32 KiB of shared memory).
pub const INDEXER_TOPK_SEGMENT: u32 = 4096;

/// `ds4_indexer_topk_segments` then `ds4_indexer_topk_merge`: the selection of `topk` (the list
/// of `indexer_topk`) with segments of `seg` rows;
/// the scores of tokens with more than one segment are overwritten. `grid_rows` >= the rows the
/// batch's last token sees. `None` when seg misses the kernels' bounds (2 top_k <= seg <= 4096).
/// Grids (max(1, grid_rows / seg), n_tok) and (n_tok).
pub fn indexer_topk_segmented(topk: &IndexerTopk, seg: u32, grid_rows: u32, n_tok: u32) -> Option<[Launch; 2]> {
    if topk.top_k == 0 || seg < 2 * topk.top_k || seg > INDEXER_TOPK_SEGMENT {
        return None;
    }
    let args = [topk.args(), vec![u(seg)]].concat();
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

    /// The selection over `rows` compressed rows of a ratio-4 layer (scores strided by `rows`).
    fn topk(rows: u32) -> IndexerTopk {
        IndexerTopk {
            sel: 1,
            scores: 2,
            pos: 3,
            score_stride: rows,
            n_comp_avail: rows,
            ratio: 4,
            top_k: 512,
        }
    }

    #[test]
    fn segments_cover_the_rows_and_bound_the_segment() {
        let [s, m] = indexer_topk_segmented(&topk(262144), 4096, 262144, 1).unwrap();
        assert_eq!((s.grid, m.grid), ([64, 1, 1], [1, 1, 1]));
        // The remainder joins the last segment; a short context has one.
        let [s, _] = indexer_topk_segmented(&topk(9000), 4096, 9000, 2).unwrap();
        assert_eq!(s.grid, [2, 2, 1]);
        let [s, _] = indexer_topk_segmented(&topk(600), 4096, 600, 1).unwrap();
        assert_eq!(s.grid, [1, 1, 1]);
        assert!(indexer_topk_segmented(&topk(600), 1000, 600, 1).is_none());
        assert!(indexer_topk_segmented(&topk(600), 8192, 600, 1).is_none());
    }
}
