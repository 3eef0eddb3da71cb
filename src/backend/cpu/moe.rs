//! FFN sublayer pieces (docs/model.md#moe): router (sqrt-softplus), expert selection (hash table or biased
//! top-k), route weights, the routed SwiGLU experts with Q8_K activations, and the shared expert's
//! clamped SwiGLU.
//!
//! Owns the per-token routed MoE; the batched shared expert is driven from `forward.rs`.

use crate::model::hparams::HParams;

use super::matvec::{Mat, matmul, matvec_expert};
use super::ops::{silu, softplus};
use super::quant::{BlockQ8K, Q8_0Act, QK_K, quantize_q8_k};
use super::resolved::LayerW;

/// Minimum of the selected-probability sum before normalisation (docs/model.md#router).
const ROUTE_SUM_FLOOR: f32 = 6.103_515_6e-5;

pub struct MoeScratch {
    pub logits: Vec<f32>,
    pub probs: Vec<f32>,
    pub sel_score: Vec<f32>,
    pub selected: Vec<usize>,
    pub weights: Vec<f32>,
    pub xq: Vec<BlockQ8K>,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub midq: Vec<BlockQ8K>,
    pub down: Vec<f32>,
    /// The router input as Q8_0, for a Q8_0 router (the DSpark stages').
    pub router_q8: Q8_0Act,
}

impl MoeScratch {
    pub fn new(hp: &HParams) -> MoeScratch {
        MoeScratch {
            logits: vec![0.0; hp.n_expert],
            probs: vec![0.0; hp.n_expert],
            sel_score: vec![0.0; hp.n_expert],
            selected: vec![0; hp.n_expert_used],
            weights: vec![0.0; hp.n_expert_used],
            xq: vec![BlockQ8K::default(); hp.n_embd.div_ceil(QK_K)],
            gate: vec![0.0; hp.n_ff_exp],
            up: vec![0.0; hp.n_ff_exp],
            midq: vec![BlockQ8K::default(); hp.n_ff_exp.div_ceil(QK_K)],
            down: vec![0.0; hp.n_embd],
            router_q8: Q8_0Act::with_len(hp.n_embd),
        }
    }
}

/// Asymmetric SwiGLU clamp (docs/model.md#swiglu-clamp): gate ≤ c only, up ∈ [−c, c]; off when c ≤ 1e-6.
#[inline]
pub fn swiglu(g: f32, u: f32, clamp: f32) -> f32 {
    if clamp > 1.0e-6 {
        silu(g.min(clamp)) * u.clamp(-clamp, clamp)
    } else {
        silu(g) * u
    }
}

/// Insertion top-k in descending order; an element must be strictly greater to move ahead, so
/// ties keep the lower index first. (Router scores are finite, so `<=` is the negation of `>`.)
pub fn top_k_desc(score: &[f32], k: usize, idx: &mut [usize]) {
    let mut n = 0usize;
    for (i, &s) in score.iter().enumerate() {
        let mut j = 0;
        while j < n && s <= score[idx[j]] {
            j += 1;
        }
        if j < k {
            let end = n.min(k - 1);
            for m in (j..end).rev() {
                idx[m + 1] = idx[m];
            }
            idx[j] = i;
            n = (n + 1).min(k);
        }
    }
}

/// Routed experts for one token: `out` (E) = Σ_i down_i(Q8_K(w_i · swiglu(gate_i·x, up_i·x))).
#[allow(clippy::too_many_arguments)]
pub fn routed(
    pool: &rayon::ThreadPool,
    file: &[u8],
    hp: &HParams,
    lw: &LayerW,
    xn: &[f32],
    token: u32,
    s: &mut MoeScratch,
    out: &mut [f32],
) {
    let k = hp.n_expert_used;
    // Router logits: F16 weights against the f32 activation in the main model, Q8_0 in DSpark's
    // stages (docs/arithmetic.md#products-by-weight-type).
    matmul(
        pool,
        file,
        &lw.router,
        xn,
        1,
        &mut s.logits,
        std::slice::from_mut(&mut s.router_q8),
    );
    for (p, &l) in s.probs.iter_mut().zip(&s.logits) {
        *p = softplus(l).sqrt();
    }
    match &lw.tid2eid {
        Some(tab) => {
            for i in 0..k {
                s.selected[i] = tab[token as usize * k + i] as usize;
            }
        }
        None => {
            s.sel_score.copy_from_slice(&s.probs);
            if let Some(b) = &lw.router_bias {
                s.sel_score.iter_mut().zip(b).for_each(|(v, &bi)| *v += bi);
            }
            top_k_desc(&s.sel_score, k, &mut s.selected);
        }
    }
    for i in 0..k {
        s.weights[i] = s.probs[s.selected[i]];
    }
    // Sum and normalisation in the grouping ds4's -ffast-math build uses: pairwise for 6 experts,
    // and w·scale·(1/sum) instead of w/sum·scale.
    let w = &s.weights;
    let sum = if k == 6 {
        ((w[0] + w[1]) + (w[2] + w[3])) + (w[4] + w[5])
    } else {
        w.iter().sum::<f32>()
    };
    let inv = 1.0 / sum.max(ROUTE_SUM_FLOOR);
    for w in s.weights.iter_mut() {
        *w = *w * hp.expert_weights_scale * inv;
    }

    quantize_q8_k(xn, &mut s.xq);
    out.fill(0.0);
    for i in 0..k {
        let e = s.selected[i];
        matvec_expert(pool, file, &Mat::expert(&lw.gate_exps, e), &s.xq, &mut s.gate);
        matvec_expert(pool, file, &Mat::expert(&lw.up_exps, e), &s.xq, &mut s.up);
        // The route weight scales the mid before its quantization (docs/model.md#routed-experts).
        let w = s.weights[i];
        for (g, &u) in s.gate.iter_mut().zip(&s.up) {
            *g = swiglu(*g, u, lw.clamp) * w;
        }
        quantize_q8_k(&s.gate, &mut s.midq);
        matvec_expert(pool, file, &Mat::expert(&lw.down_exps, e), &s.midq, &mut s.down);
        out.iter_mut().zip(&s.down).for_each(|(o, &d)| *o += d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_desc_orders_and_breaks_ties_low() {
        let mut idx = [0usize; 3];
        top_k_desc(&[0.5, 0.9, 0.9, 0.1, 0.95], 3, &mut idx);
        assert_eq!(idx, [4, 1, 2]);
    }

    #[test]
    fn swiglu_clamp_is_asymmetric() {
        // gate has no lower bound: silu(−20)·u stays tiny but non-clamped; up is clamped both ways.
        assert_eq!(swiglu(50.0, 50.0, 10.0), silu(10.0) * 10.0);
        assert_eq!(swiglu(-50.0, -50.0, 10.0), silu(-50.0) * -10.0);
    }
}
