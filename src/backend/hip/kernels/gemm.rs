//! Builders of the dense GEMMs of kernels/gemm.hip (prefill chunks): 64 x 64 output tiles.

use super::abi::{DevPtr, GEMM_F16, GEMM_Q8_0, GEMM_Q8_0_SWIGLU};
use super::launch::{Launch, blocks, f, ptr, u};

/// Output tile edge of the GEMM kernels (DS4_GM_ROWS = DS4_GM_TOKS).
pub const GEMM_TILE: u32 = 64;

/// `ds4_gemm_q8_0`: batched Q8_0 projection with Q8_0 activations (grouped like
/// [`matvec_q8_0`]; rows_per_group must be a multiple of 64). Grid (ceil(n_out/64), ceil(n_tok/64)).
pub fn gemm_q8_0(
    y: DevPtr,
    w: DevPtr,
    xq: DevPtr,
    xd: DevPtr,
    n_in: u32,
    n_out: u32,
    rows_per_group: u32,
    x_stride: u32,
    n_tok: u32,
) -> Launch {
    assert!(
        rows_per_group.is_multiple_of(GEMM_TILE),
        "gemm_q8_0: rows_per_group {rows_per_group} % 64 != 0"
    );
    Launch::new(
        &GEMM_Q8_0,
        [blocks(n_out, GEMM_TILE), blocks(n_tok, GEMM_TILE), 1],
        vec![
            ptr(y),
            ptr(w),
            ptr(xq),
            ptr(xd),
            u(n_in),
            u(n_out),
            u(rows_per_group),
            u(x_stride),
            u(n_tok),
        ],
    )
}

/// `ds4_gemm_q8_0_swiglu`: batched shared-expert gate/up + SwiGLU. Grid (ceil(n_ff/64), ceil(n_tok/64)).
pub fn gemm_q8_0_swiglu(
    mid: DevPtr,
    wg: DevPtr,
    wu: DevPtr,
    xq: DevPtr,
    xd: DevPtr,
    n_in: u32,
    n_ff: u32,
    limit: f32,
    n_tok: u32,
) -> Launch {
    Launch::new(
        &GEMM_Q8_0_SWIGLU,
        [blocks(n_ff, GEMM_TILE), blocks(n_tok, GEMM_TILE), 1],
        vec![
            ptr(mid),
            ptr(wg),
            ptr(wu),
            ptr(xq),
            ptr(xd),
            u(n_in),
            u(n_ff),
            f(limit),
            u(n_tok),
        ],
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
