//! Builders of kernels/matvec_cols.hip: the matvecs of `matvec` for a block of 2..=[`MATVEC_COLS`]
//! tokens ("columns": a speculative verify block) in one grid row, each weight read once for the
//! block instead of once per token. Each column's output has the bits of the `matvec` kernel for
//! that token alone; the arguments are that kernel's plus `n_tok`, and the fast twins
//! (`fast_twins`, kernels/matvec_cols_fast.hip) have the bits of the single-token fast kernels.

use super::abi::{DevPtr, MATVEC_F16_COLS, MATVEC_F16_PAIR_COLS, MATVEC_Q8_0_COLS, MATVEC_Q8_0_SWIGLU_COLS};
use super::launch::{Launch, blocks, ptr, u};
use super::matvec::{MATVEC_ROWS, Q8Proj, Q8Swiglu};

/// Most tokens of a column launch (the kernels' DS4_COLS: one accumulator a column in registers).
pub const MATVEC_COLS: u32 = 8;

/// `n_tok`, asserted to be a column launch's token count.
pub(super) fn checked(n_tok: u32) -> u32 {
    assert!(
        (1..=MATVEC_COLS).contains(&n_tok),
        "column matvec of {n_tok} tokens (1..={MATVEC_COLS})"
    );
    n_tok
}

/// `ds4_matvec_q8_0_cols`: the projection `p` of `n_tok` tokens, each weight row read once. Grid
/// (ceil(n_out/8)).
pub fn matvec_q8_0_cols(p: &Q8Proj, n_tok: u32) -> Launch {
    let args = [p.args(), vec![u(checked(n_tok))]].concat();
    Launch::new(&MATVEC_Q8_0_COLS, [blocks(p.n_out, MATVEC_ROWS), 1, 1], args)
}

/// `ds4_matvec_q8_0_swiglu_cols`: the shared expert's gate/up + clamped SwiGLU of `n_tok` tokens.
/// Grid (ceil(n_ff/8)).
pub fn matvec_q8_0_swiglu_cols(s: &Q8Swiglu, n_tok: u32) -> Launch {
    let args = [s.args(), vec![u(checked(n_tok))]].concat();
    Launch::new(&MATVEC_Q8_0_SWIGLU_COLS, [blocks(s.n_ff, MATVEC_ROWS), 1, 1], args)
}

/// `ds4_matvec_f16_cols`: y[t][r] = W[r] · x_t for `n_tok` tokens (x rows `x_stride` floats apart).
/// Grid (ceil(n_out/8)).
pub fn matvec_f16_cols(y: DevPtr, w: DevPtr, x: DevPtr, n_in: u32, n_out: u32, x_stride: u32, n_tok: u32) -> Launch {
    Launch::new(
        &MATVEC_F16_COLS,
        [blocks(n_out, MATVEC_ROWS), 1, 1],
        vec![
            ptr(y),
            ptr(w),
            ptr(x),
            u(n_in),
            u(n_out),
            u(x_stride),
            u(checked(n_tok)),
        ],
    )
}

/// `ds4_matvec_f16_pair_cols`: y0 = W0·x, y1 = W1·x (same shapes) for `n_tok` tokens. Grid
/// (ceil(2*n_out/8)).
pub fn matvec_f16_pair_cols(
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
        &MATVEC_F16_PAIR_COLS,
        [blocks(2 * n_out, MATVEC_ROWS), 1, 1],
        vec![
            ptr(y0),
            ptr(y1),
            ptr(w0),
            ptr(w1),
            ptr(x),
            u(n_in),
            u(n_out),
            u(x_stride),
            u(checked(n_tok)),
        ],
    )
}
