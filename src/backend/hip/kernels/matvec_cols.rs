//! Builders of kernels/matvec_cols.hip: the matvecs of `matvec` for a block of 2..=[`MATVEC_COLS`]
//! tokens ("columns": a speculative verify block) in one grid row, each weight read once for the
//! block instead of once per token. Each column's output has the bits of the `matvec` kernel for
//! that token alone; the arguments are that kernel's plus `n_tok`, and the fast twins
//! (`fast_twins`, kernels/matvec_cols_fast.hip) have the bits of the single-token fast kernels.

use super::abi::{DevPtr, KernelDef, MATVEC_F16_COLS, MATVEC_F16_PAIR_COLS, MATVEC_Q8_0_COLS, MATVEC_Q8_0_SWIGLU_COLS};
use super::launch::{Launch, u};
use super::matvec::{Q8Proj, Q8Swiglu, matvec_f16, matvec_f16_pair, matvec_q8_0, matvec_q8_0_swiglu};

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

/// The column form of `single`, a one-token launch of the `matvec` kernel whose column twin is
/// `kernel`: the same arguments plus `n_tok`, one grid row.
fn columns(kernel: &'static KernelDef, single: Launch, n_tok: u32) -> Launch {
    let mut args = single.args;
    args.push(u(checked(n_tok)));
    Launch::new(kernel, [single.grid[0], 1, 1], args)
}

/// `ds4_matvec_q8_0_cols`: the projection `p` of `n_tok` tokens, each weight row read once. Grid
/// (ceil(n_out/8)).
pub fn matvec_q8_0_cols(p: &Q8Proj, n_tok: u32) -> Launch {
    columns(&MATVEC_Q8_0_COLS, matvec_q8_0(p, 1), n_tok)
}

/// `ds4_matvec_q8_0_swiglu_cols`: the shared expert's gate/up + clamped SwiGLU of `n_tok` tokens.
/// Grid (ceil(n_ff/8)).
pub fn matvec_q8_0_swiglu_cols(s: &Q8Swiglu, n_tok: u32) -> Launch {
    columns(&MATVEC_Q8_0_SWIGLU_COLS, matvec_q8_0_swiglu(s, 1), n_tok)
}

/// `ds4_matvec_f16_cols`: y[t][r] = W[r] · x_t for `n_tok` tokens (x rows `x_stride` floats apart).
/// Grid (ceil(n_out/8)).
pub fn matvec_f16_cols(y: DevPtr, w: DevPtr, x: DevPtr, n_in: u32, n_out: u32, x_stride: u32, n_tok: u32) -> Launch {
    columns(&MATVEC_F16_COLS, matvec_f16(y, w, x, n_in, n_out, x_stride, 1), n_tok)
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
    let single = matvec_f16_pair(y0, y1, w0, w1, x, n_in, n_out, x_stride, 1);
    columns(&MATVEC_F16_PAIR_COLS, single, n_tok)
}
