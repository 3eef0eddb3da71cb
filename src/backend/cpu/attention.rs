//! Attention core (docs/model.md#attention-core): every query head against the shared K = V rows (the raw
//! window, then the visible compressed rows), with a per-head sink that adds probability mass but no value.
//!
//! Owns only the softmax-weighted sum; row selection (indexer) and projections live elsewhere.

use rayon::prelude::*;

use super::compressor::NEG_INF;
use super::quant::{axpy_fma, dot_f32};
use super::transcend;

/// Rows one token attends to.
pub struct Visible<'a> {
    pub raw: &'a [f32],
    pub comp: &'a [f32],
    /// Indexer selection over the compressed rows (None = all visible).
    pub allowed: Option<&'a [bool]>,
}

/// `out` (H × D) = attention of `q` (H × D) over the visible rows. `scores` is scratch of at least
/// H × (rows) floats. Heads run in parallel; each head's arithmetic is independent of the split.
pub fn attend(
    pool: &rayon::ThreadPool,
    q: &[f32],
    vis: &Visible<'_>,
    sinks: &[f32],
    head_dim: usize,
    out: &mut [f32],
    scores: &mut [f32],
) {
    let n_raw = vis.raw.len() / head_dim;
    let n_comp = vis.comp.len() / head_dim;
    let n_rows = n_raw + n_comp;
    let n_head = sinks.len();
    let kq_scale = 1.0 / (head_dim as f32).sqrt();
    let per_head = |(h, (oh, sc)): (usize, (&mut [f32], &mut [f32]))| {
        let qh = &q[h * head_dim..(h + 1) * head_dim];
        let mut m = sinks[h];
        for (r, slot) in sc.iter_mut().enumerate().take(n_rows) {
            let s = if r < n_raw {
                dot_f32(qh, &vis.raw[r * head_dim..(r + 1) * head_dim]) * kq_scale
            } else {
                let c = r - n_raw;
                if vis.allowed.is_some_and(|a| !a[c]) {
                    *slot = NEG_INF;
                    continue;
                }
                dot_f32(qh, &vis.comp[c * head_dim..(c + 1) * head_dim]) * kq_scale
            };
            *slot = s;
            m = m.max(s);
        }
        oh.fill(0.0);
        let mut den = transcend::exp(sinks[h] - m);
        for (r, &score) in sc.iter().enumerate().take(n_rows) {
            if score <= NEG_INF * 0.5 {
                continue;
            }
            let row = if r < n_raw {
                &vis.raw[r * head_dim..(r + 1) * head_dim]
            } else {
                let c = r - n_raw;
                &vis.comp[c * head_dim..(c + 1) * head_dim]
            };
            let wgt = transcend::exp(score - m);
            den += wgt;
            axpy_fma(oh, row, wgt);
        }
        let inv = 1.0 / den;
        oh.iter_mut().for_each(|v| *v *= inv);
    };
    let out = &mut out[..n_head * head_dim];
    let scores = &mut scores[..n_head * n_rows.max(1)];
    if pool.current_num_threads() <= 1 {
        out.chunks_mut(head_dim)
            .zip(scores.chunks_mut(n_rows.max(1)))
            .enumerate()
            .for_each(per_head);
    } else {
        pool.install(|| {
            out.par_chunks_mut(head_dim)
                .zip(scores.par_chunks_mut(n_rows.max(1)))
                .enumerate()
                .for_each(per_head)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One head, one row: with sink s and score z the output is row · e^z / (e^z + e^s).
    #[test]
    fn sink_adds_mass_without_value() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let d = 4;
        let q = [1.0f32, 0.0, 0.0, 0.0];
        let row = [2.0f32, 1.0, 0.0, -1.0];
        let sinks = [0.5f32];
        let mut out = [0.0f32; 4];
        let mut sc = [0.0f32; 4];
        let vis = Visible {
            raw: &row,
            comp: &[],
            allowed: None,
        };
        attend(&pool, &q, &vis, &sinks, d, &mut out, &mut sc);
        let z = 2.0f32 / 2.0; // q·row / sqrt(4)
        let p = z.exp() / (z.exp() + 0.5f32.exp());
        for (o, r) in out.iter().zip(row) {
            assert!((o - r * p).abs() < 1e-6);
        }
        // A masked compressed row contributes nothing.
        let vis2 = Visible {
            raw: &row,
            comp: &[9.0, 9.0, 9.0, 9.0],
            allowed: Some(&[false]),
        };
        let mut out2 = [0.0f32; 4];
        let mut sc2 = [0.0f32; 8];
        attend(&pool, &q, &vis2, &sinks, d, &mut out2, &mut sc2);
        assert_eq!(out, out2);
    }
}
