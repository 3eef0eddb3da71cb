//! Lightning indexer of ratio-4 layers (docs/model.md#indexer): when more compressed rows exist than top-k,
//! score every indexer row against the FP4-simulated query heads and keep the top-k rows.
//!
//! Owns the scoring and the selection rule (strict `>`, ties to the lower row).

use super::matvec::{Mat, par_rows};
use super::ops::{self, Rope};
use super::quant::dot_f32;
use super::resolved::IndexerW;

/// Scratch of the indexer for one token.
pub struct IndexerScratch {
    pub q: Vec<f32>,
    pub w: Vec<f32>,
    pub scores: Vec<f32>,
    pub allowed: Vec<bool>,
}

impl IndexerScratch {
    pub fn new(n_head: usize, head_dim: usize, comp_cap: usize) -> IndexerScratch {
        IndexerScratch {
            q: vec![0.0; n_head * head_dim],
            w: vec![0.0; n_head],
            scores: vec![0.0; comp_cap],
            allowed: vec![false; comp_cap],
        }
    }
}

/// Fill `s.allowed[..n_comp]`. Returns false (nothing computed, everything visible) when
/// n_comp ≤ top_k.
#[allow(clippy::too_many_arguments)]
pub fn select(
    pool: &rayon::ThreadPool,
    file: &[u8],
    iw: &IndexerW,
    rope: &Rope,
    qrn: &[f32],
    xn: &[f32],
    rows: &[f32],
    head_dim: usize,
    top_k: usize,
    pos: usize,
    s: &mut IndexerScratch,
) -> bool {
    let n_comp = rows.len() / head_dim;
    if n_comp <= top_k {
        return false;
    }
    let f16_matvec = |m: &Mat, x: &[f32], out: &mut [f32]| {
        par_rows(pool, out, 1, m.n_out, |o, _| super::quant::dot_f16(m.row(file, o), x));
    };
    let n_head = iw.proj.n_out;
    f16_matvec(&iw.q_b, qrn, &mut s.q[..n_head * head_dim]);
    rope.apply(&mut s.q[..n_head * head_dim], head_dim, pos, false);
    for qh in s.q[..n_head * head_dim].chunks_exact_mut(head_dim) {
        ops::indexer_qat(qh);
    }
    f16_matvec(&iw.proj, xn, &mut s.w[..n_head]);
    let scale = 1.0 / ((head_dim * n_head) as f32).sqrt();
    s.w[..n_head].iter_mut().for_each(|v| *v *= scale);
    for c in 0..n_comp {
        let k = &rows[c * head_dim..(c + 1) * head_dim];
        let mut acc = 0.0f32;
        for h in 0..n_head {
            let d = dot_f32(k, &s.q[h * head_dim..(h + 1) * head_dim]).max(0.0);
            acc += d * s.w[h];
        }
        s.scores[c] = acc;
    }
    top_k_mask(&s.scores[..n_comp], top_k, &mut s.allowed[..n_comp]);
    true
}

/// Mark the `k` highest scores; repeated strict-`>` scans so ties go to the lowest index.
pub fn top_k_mask(scores: &[f32], k: usize, allowed: &mut [bool]) {
    allowed.fill(false);
    for _ in 0..k.min(scores.len()) {
        let mut best = 0;
        let mut best_s = f32::NEG_INFINITY;
        let mut found = false;
        for (c, &sc) in scores.iter().enumerate() {
            if !allowed[c] && (!found || sc > best_s) {
                best = c;
                best_s = sc;
                found = true;
            }
        }
        allowed[best] = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_ties_go_to_lower_index() {
        let mut a = [false; 5];
        top_k_mask(&[1.0, 3.0, 3.0, 2.0, 3.0], 2, &mut a);
        assert_eq!(a, [false, true, true, false, false]);
        top_k_mask(&[0.0, 0.0, 0.0], 2, &mut a[..3]);
        assert_eq!(&a[..3], &[true, true, false]);
    }
}
