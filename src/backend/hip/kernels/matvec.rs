//! Builders of kernels/matvec.hip: Q8_0 and F16 matvecs (one grid row per token), the shared
//! expert's gate/up with SwiGLU.

use super::abi::{Arg, DevPtr, MATVEC_F16, MATVEC_F16_PAIR, MATVEC_Q8_0, MATVEC_Q8_0_SWIGLU};
use super::launch::{Launch, blocks, f, ptr, u};

/// Output rows per block of the matvec-style kernels (DS4_MV_ROWS, DS4_MOE_ROWS).
pub const MATVEC_ROWS: u32 = 8;

/// Q8_0 activations on the device: the quants `q` and the per-block scales `d`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q8Act {
    pub q: DevPtr,
    pub d: DevPtr,
}

impl Q8Act {
    fn args(&self) -> [Arg; 2] {
        [ptr(self.q), ptr(self.d)]
    }
}

/// The operands of a Q8_0 projection y[t][r] = W[r] · x_t, shared by the matvec (one token) and the
/// GEMM (a chunk), whose kernels take them in this order. Plain projection: `rows_per_group =
/// n_out`, `x_stride = n_in` ([`Q8Proj::plain`]); grouped output projection
/// (docs/model.md#grouped-output-projection): `rows_per_group = O_r`, `x_stride = G * n_in`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q8Proj {
    pub y: DevPtr,
    pub w: DevPtr,
    pub x: Q8Act,
    pub n_in: u32,
    pub n_out: u32,
    pub rows_per_group: u32,
    pub x_stride: u32,
}

impl Q8Proj {
    /// One group of all `n_out` rows, activation rows `n_in` apart.
    pub fn plain(y: DevPtr, w: DevPtr, x: Q8Act, n_in: u32, n_out: u32) -> Q8Proj {
        Q8Proj {
            y,
            w,
            x,
            n_in,
            n_out,
            rows_per_group: n_out,
            x_stride: n_in,
        }
    }

    pub(super) fn args(&self) -> Vec<Arg> {
        let rows = [u(self.n_in), u(self.n_out), u(self.rows_per_group), u(self.x_stride)];
        [&[ptr(self.y), ptr(self.w)][..], &self.x.args(), &rows].concat()
    }
}

/// The operands of the shared expert's gate/up + clamped SwiGLU, matvec and GEMM alike: mid =
/// SwiGLU(Wg · x, Wu · x) with gate and up clamped to `limit`, `n_ff` outputs from `n_in` inputs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q8Swiglu {
    pub mid: DevPtr,
    pub wg: DevPtr,
    pub wu: DevPtr,
    pub x: Q8Act,
    pub n_in: u32,
    pub n_ff: u32,
    pub limit: f32,
}

impl Q8Swiglu {
    pub(super) fn args(&self) -> Vec<Arg> {
        let weights = [ptr(self.mid), ptr(self.wg), ptr(self.wu)];
        [
            &weights[..],
            &self.x.args(),
            &[u(self.n_in), u(self.n_ff), f(self.limit)],
        ]
        .concat()
    }
}

/// `ds4_matvec_q8_0`: the projection `p` of `n_tok` tokens, one grid row per token. Grid
/// (ceil(n_out/8), n_tok).
pub fn matvec_q8_0(p: &Q8Proj, n_tok: u32) -> Launch {
    Launch::new(&MATVEC_Q8_0, [blocks(p.n_out, MATVEC_ROWS), n_tok, 1], p.args())
}

/// `ds4_matvec_q8_0_swiglu`: shared-expert gate/up + clamped SwiGLU. Grid (ceil(n_ff/8), n_tok).
pub fn matvec_q8_0_swiglu(s: &Q8Swiglu, n_tok: u32) -> Launch {
    Launch::new(&MATVEC_Q8_0_SWIGLU, [blocks(s.n_ff, MATVEC_ROWS), n_tok, 1], s.args())
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
