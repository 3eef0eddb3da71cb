//! Builders of the dense GEMMs of kernels/gemm.hip (prefill chunks): 64 x 64 output tiles.

use super::abi::{DevPtr, GEMM_F16, GEMM_Q8_0, GEMM_Q8_0_SWIGLU};
use super::launch::{Launch, blocks, ptr, u};
use super::matvec::{Q8Proj, Q8Swiglu};

/// Output tile edge of the GEMM kernels (DS4_GM_ROWS = DS4_GM_TOKS).
pub const GEMM_TILE: u32 = 64;

/// `ds4_gemm_q8_0`: the projection `p` of a chunk of `n_tok` tokens (rows_per_group must be a
/// multiple of 64). Grid (ceil(n_out/64), ceil(n_tok/64)).
pub fn gemm_q8_0(p: &Q8Proj, n_tok: u32) -> Launch {
    let rows_per_group = p.rows_per_group;
    assert!(
        rows_per_group.is_multiple_of(GEMM_TILE),
        "gemm_q8_0: rows_per_group {rows_per_group} % 64 != 0"
    );
    let args = [p.args(), vec![u(n_tok)]].concat();
    Launch::new(
        &GEMM_Q8_0,
        [blocks(p.n_out, GEMM_TILE), blocks(n_tok, GEMM_TILE), 1],
        args,
    )
}

/// `ds4_gemm_q8_0_swiglu`: batched shared-expert gate/up + SwiGLU. Grid (ceil(n_ff/64), ceil(n_tok/64)).
pub fn gemm_q8_0_swiglu(s: &Q8Swiglu, n_tok: u32) -> Launch {
    let args = [s.args(), vec![u(n_tok)]].concat();
    Launch::new(
        &GEMM_Q8_0_SWIGLU,
        [blocks(s.n_ff, GEMM_TILE), blocks(n_tok, GEMM_TILE), 1],
        args,
    )
}

/// `ds4_gemm_f16`: batched F16-weight projection, f32 activations. Grid (ceil(n_out/64), ceil(n_tok/64)).
pub fn gemm_f16(y: DevPtr, w: DevPtr, x: DevPtr, n_in: u32, n_out: u32, x_stride: u32, n_tok: u32) -> Launch {
    Launch::new(
        &GEMM_F16,
        [blocks(n_out, GEMM_TILE), blocks(n_tok, GEMM_TILE), 1],
        vec![ptr(y), ptr(w), ptr(x), u(n_in), u(n_out), u(x_stride), u(n_tok)],
    )
}
