//! Builders of kernels/matvec.hip: Q8_0 and F16 matvecs (one grid row per token), the shared
//! expert's gate/up with SwiGLU.

use super::abi::{DevPtr, MATVEC_F16, MATVEC_F16_PAIR, MATVEC_Q8_0, MATVEC_Q8_0_SWIGLU};
use super::launch::{Launch, blocks, f, ptr, u};

/// Output rows per block of the matvec-style kernels (DS4_MV_ROWS, DS4_MOE_ROWS).
pub const MATVEC_ROWS: u32 = 8;

/// `ds4_matvec_q8_0`: y[t][r] = W[r] · x_t (Q8_0 weights, Q8_0 activations). Plain projection:
/// `rows_per_group = n_out`, `x_stride = n_in`; grouped output projection
/// (docs/model.md#grouped-output-projection): `rows_per_group = O_r`, `x_stride = G * n_in`. Grid
/// (ceil(n_out/8), n_tok).
pub fn matvec_q8_0(
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
    Launch::new(
        &MATVEC_Q8_0,
        [blocks(n_out, MATVEC_ROWS), n_tok, 1],
        vec![
            ptr(y),
            ptr(w),
            ptr(xq),
            ptr(xd),
            u(n_in),
            u(n_out),
            u(rows_per_group),
            u(x_stride),
        ],
    )
}

/// `ds4_matvec_q8_0_swiglu`: shared-expert gate/up + clamped SwiGLU. Grid (ceil(n_ff/8), n_tok).
pub fn matvec_q8_0_swiglu(
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
        &MATVEC_Q8_0_SWIGLU,
        [blocks(n_ff, MATVEC_ROWS), n_tok, 1],
        vec![ptr(mid), ptr(wg), ptr(wu), ptr(xq), ptr(xd), u(n_in), u(n_ff), f(limit)],
    )
}

/// `ds4_matvec_f16`: y[t][r] = W[r] · x_t (F16 weights, f32 activations). Grid (ceil(n_out/8), n_tok).
pub fn matvec_f16(y: DevPtr, w: DevPtr, x: DevPtr, n_in: u32, n_out: u32, x_stride: u32, n_tok: u32) -> Launch {
    Launch::new(
        &MATVEC_F16,
        [blocks(n_out, MATVEC_ROWS), n_tok, 1],
        vec![ptr(y), ptr(w), ptr(x), u(n_in), u(n_out), u(x_stride)],
    )
}

/// `ds4_matvec_f16_pair`: y0 = W0·x, y1 = W1·x (same shapes). Grid (ceil(2*n_out/8), n_tok).
pub fn matvec_f16_pair(
    y0: DevPtr,
    y1: DevPtr,
    w0: DevPtr,
    w1: DevPtr,
    x: DevPtr,
    n_in: u32,
    n_out: u32,
    x_stride: u32,
    n_tok: u32,
) -> Launch {
    Launch::new(
        &MATVEC_F16_PAIR,
        [blocks(2 * n_out, MATVEC_ROWS), n_tok, 1],
        vec![
            ptr(y0),
            ptr(y1),
            ptr(w0),
            ptr(w1),
            ptr(x),
            u(n_in),
            u(n_out),
            u(x_stride),
        ],
    )
}
