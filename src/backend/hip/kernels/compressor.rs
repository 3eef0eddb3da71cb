//! Builders of kernels/compressor.hip: the compressor's state walk and pooled rows, and the row
//! counts a batch emits.

use super::abi::{COMPRESSOR_POOL, DevPtr};
use super::launch::{BLOCK, Launch, blocks, ptr, u};

/// Compressed rows a batch at pos0..pos0+n_tok emits: (first row index, count)
/// (docs/model.md#compressor).
pub fn compressor_emitted(ratio: u32, pos0: u32, n_tok: u32) -> (u32, u32) {
    if ratio == 0 {
        return (0, 0);
    }
    let first = pos0 / ratio;
    (first, (pos0 + n_tok) / ratio - first)
}

/// The most compressed rows a batch of n_tok tokens can emit at any position: one every `ratio`
/// tokens, plus one when the batch straddles a boundary.
pub fn compressor_max_emitted(ratio: u32, n_tok: u32) -> u32 {
    if ratio == 0 || n_tok == 0 {
        0
    } else {
        (n_tok - 1) / ratio + 1
    }
}

/// `ds4_compressor_pool`: state update for the batch at pos0.. (device word `pos`) and raw pooled
/// rows into comp_rows; follow it with [`rows_finish_emitted`]. Grid (ceil(head_dim/256)).
pub fn compressor_pool(
    comp_rows: DevPtr,
    state_kv: DevPtr,
    state_score: DevPtr,
    kv_cur: DevPtr,
    sc_cur: DevPtr,
    ape: DevPtr,
    pos: DevPtr,
    head_dim: u32,
    ratio: u32,
    n_tok: u32,
    comp_cap: u32,
) -> Launch {
    assert!(ratio > 0, "compressor_pool: ratio 0");
    Launch::new(
        &COMPRESSOR_POOL,
        [blocks(head_dim, BLOCK), 1, 1],
        vec![
            ptr(comp_rows),
            ptr(state_kv),
            ptr(state_score),
            ptr(kv_cur),
            ptr(sc_cur),
            ptr(ape),
            ptr(pos),
            u(head_dim),
            u(ratio),
            u(n_tok),
            u(comp_cap),
        ],
    )
}
