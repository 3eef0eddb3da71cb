//! Builders of kernels/hc.hip: the hyper-connection mix, split and post steps.

use super::abi::{Arg, DevPtr, HC_HEAD_FINISH, HC_MIX, HC_POST, HC_PRE_FINISH, HC_PRE_FUSED};
use super::launch::{BLOCK, Launch, blocks, f, ptr, u};
use super::norm_quant::QuantOut;

/// `ds4_hc_mix`: mix[t][o] = fn[o] · (X_t RMS-normalized with `eps`), one block per (o, t): the
/// sequential F16 dot of the CPU reference. Grid (n_mix, n_tok).
pub fn hc_mix(mix: DevPtr, hc: DevPtr, fn_w: DevPtr, n_in: u32, n_mix: u32, eps: f32, n_tok: u32) -> Launch {
    assert!(n_mix <= 24, "hc_mix: n_mix {n_mix} > 24");
    Launch::new(
        &HC_MIX,
        [n_mix, n_tok, 1],
        vec![ptr(mix), ptr(hc), ptr(fn_w), u(n_in), u(n_mix), f(eps)],
    )
}

/// What the HC finishing steps ([`hc_pre_finish`], [`hc_head_finish`]) read, in their kernels'
/// order: the `mix` of the HC state (a [`hc_mix`]), the state `hc` [n_tok][n_hc][n_embd] itself and
/// the step's `scale` and `base` tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HcMixed {
    pub mix: DevPtr,
    pub hc: DevPtr,
    pub scale: DevPtr,
    pub base: DevPtr,
    pub n_embd: u32,
    pub n_hc: u32,
}

impl HcMixed {
    fn args(&self) -> [Arg; 6] {
        [
            ptr(self.mix),
            ptr(self.hc),
            ptr(self.scale),
            ptr(self.base),
            u(self.n_embd),
            u(self.n_hc),
        ]
    }
}

/// `ds4_hc_pre_finish`: Sinkhorn split and weighted stream sum from `m.mix` [n_tok][2 n_hc + n_hc²];
/// split_out has the same shape. Grid (n_tok).
pub fn hc_pre_finish(x_out: DevPtr, split_out: DevPtr, m: &HcMixed, iters: u32, eps_hc: f32, n_tok: u32) -> Launch {
    let n_hc = m.n_hc;
    assert!(n_hc <= 4, "hc_pre_finish: n_hc {n_hc} > 4");
    let args = [&[ptr(x_out), ptr(split_out)][..], &m.args(), &[u(iters), f(eps_hc)]].concat();
    Launch::new(&HC_PRE_FINISH, [n_tok, 1, 1], args)
}

/// Eps values of the fused HC pre step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HcEps {
    /// RMS eps of the HC state norm, HC eps of the split, eps of the sublayer's input RMSNorm.
    pub rms: f32,
    pub hc: f32,
    pub norm: f32,
}

/// `ds4_hc_pre_fused`: the whole HC pre step (mix, Sinkhorn split, weighted sum) plus the sublayer's
/// input RMSNorm * norm_w and its quantizations, in one launch. `o.out` receives xn (may be NULL),
/// `o.q8_0_*` / `o.q8_k_*` its activations (NULL = not wanted). mix: f32 [n_tok][n_mix] scratch;
/// counter: u32 [n_tok], zeroed once before first use. n_embd <= 4096. Grid (n_mix, n_tok).
pub fn hc_pre_fused(
    split_out: DevPtr,
    o: QuantOut,
    mix: DevPtr,
    counter: DevPtr,
    hc: DevPtr,
    fn_w: DevPtr,
    scale: DevPtr,
    base: DevPtr,
    norm_w: DevPtr,
    n_embd: u32,
    n_hc: u32,
    iters: u32,
    eps: HcEps,
    n_tok: u32,
) -> Launch {
    assert!(
        n_embd <= 4096 && n_hc <= 4,
        "hc_pre_fused: n_embd {n_embd} > 4096 or n_hc {n_hc} > 4"
    );
    Launch::new(
        &HC_PRE_FUSED,
        [2 * n_hc + n_hc * n_hc, n_tok, 1],
        [
            &[ptr(split_out)][..],
            &o.args(),
            &[
                ptr(mix),
                ptr(counter),
                ptr(hc),
                ptr(fn_w),
                ptr(scale),
                ptr(base),
                ptr(norm_w),
                u(n_embd),
                u(n_hc),
                u(iters),
                f(eps.rms),
                f(eps.hc),
                f(eps.norm),
            ],
        ]
        .concat(),
    )
}

/// `ds4_hc_head_finish`: output-head stream weights and sum from `mix` [n_tok][n_hc] (a
/// [`hc_mix`] of output_hc_fn). Grid (n_tok).
pub fn hc_head_finish(x_out: DevPtr, m: &HcMixed, eps_hc: f32, n_tok: u32) -> Launch {
    let args = [&[ptr(x_out)][..], &m.args(), &[f(eps_hc)]].concat();
    Launch::new(&HC_HEAD_FINISH, [n_tok, 1, 1], args)
}

/// `ds4_hc_post`: X' = post·(y + y2) + Mᵀ X (y2 may be NULL; hc_out may equal hc_in).
/// Grid (ceil(n_embd/256), n_tok).
pub fn hc_post(
    hc_out: DevPtr,
    hc_in: DevPtr,
    y: DevPtr,
    y2: DevPtr,
    split: DevPtr,
    n_embd: u32,
    n_hc: u32,
    n_tok: u32,
) -> Launch {
    Launch::new(
        &HC_POST,
        [blocks(n_embd, BLOCK), n_tok, 1],
        vec![ptr(hc_out), ptr(hc_in), ptr(y), ptr(y2), ptr(split), u(n_embd), u(n_hc)],
    )
}
