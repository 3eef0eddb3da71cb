//! Builders of the fast-mode GEMMs of kernels/gemm_fast.hip (matrix-core tiles, kernels/mma.h):
//! the same arguments as their exact twins in `gemm`, 64-row x 128-token output tiles.

use super::abi::{DevPtr, GEMM_F16_MMA, GEMM_Q8_0_MMA};
use super::gemm::GEMM_TILE;
use super::launch::{Launch, blocks, ptr, u};
use super::matvec::Q8Proj;

/// Tokens per block of the matrix-core GEMMs (DS4_MM_TOKS); their row tiles are [`GEMM_TILE`].
pub const MMA_TOKEN_TILE: u32 = 128;

/// `ds4_gemm_q8_0_mma`: [`super::gemm_q8_0`] on int8 matrix tiles (rows_per_group a multiple of 64).
/// Grid (ceil(n_out/64), ceil(n_tok/128)).
pub fn gemm_q8_0_mma(p: &Q8Proj, n_tok: u32) -> Launch {
    let rows_per_group = p.rows_per_group;
    assert!(
        rows_per_group.is_multiple_of(GEMM_TILE),
        "gemm_q8_0_mma: rows_per_group {rows_per_group} % 64 != 0"
    );
    let args = [p.args(), vec![u(n_tok)]].concat();
    Launch::new(
        &GEMM_Q8_0_MMA,
        [blocks(p.n_out, GEMM_TILE), blocks(n_tok, MMA_TOKEN_TILE), 1],
        args,
    )
}

/// `ds4_gemm_f16_mma`: [`super::gemm_f16`] on f16 matrix tiles (activations split into two f16
/// halves). Grid (ceil(n_out/64), ceil(n_tok/128)).
pub fn gemm_f16_mma(y: DevPtr, w: DevPtr, x: DevPtr, n_in: u32, n_out: u32, x_stride: u32, n_tok: u32) -> Launch {
    Launch::new(
        &GEMM_F16_MMA,
        [blocks(n_out, GEMM_TILE), blocks(n_tok, MMA_TOKEN_TILE), 1],
        vec![ptr(y), ptr(w), ptr(x), u(n_in), u(n_out), u(x_stride), u(n_tok)],
    )
}
