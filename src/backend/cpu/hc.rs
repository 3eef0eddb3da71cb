//! Hyper-connections: the Sinkhorn split of the control vector (docs/model.md#hc-pre), the weighted stream
//! reduction, and the post step that writes a sublayer output back into the N_hc streams
//! (docs/model.md#hc-post).
//!
//! The combine matrix is stored row-major as `comb[src·n + dst]` (docs/model.md#hc-post): the softmax runs over
//! `dst` for each `src`, the post step computes new[dst] = Σ_src comb[src·n + dst]·old[src].

use super::ops::sigmoid;
use super::transcend;

/// Split a control vector `mix` (2n + n² values) into pre weights (sigmoid + eps, not normalised),
/// post weights (2·sigmoid) and the Sinkhorn-normalised combine matrix (docs/model.md#hc-pre).
/// `scale` = (s_pre, s_post, s_comb); `base` has the mix width.
#[allow(clippy::too_many_arguments)]
pub fn split_sinkhorn(
    mix: &[f32],
    scale: &[f32],
    base: &[f32],
    n: usize,
    iters: usize,
    eps: f32,
    pre: &mut [f32],
    post: &mut [f32],
    comb: &mut [f32],
) {
    for i in 0..n {
        pre[i] = sigmoid(mix[i] * scale[0] + base[i]) + eps;
        post[i] = 2.0 * sigmoid(mix[n + i] * scale[1] + base[n + i]);
    }
    let c = &mut comb[..n * n];
    for src in 0..n {
        let row = &mut c[src * n..(src + 1) * n];
        let mut m = -1.0e30f32;
        for (dst, v) in row.iter_mut().enumerate() {
            let k = 2 * n + src * n + dst;
            *v = mix[k] * scale[2] + base[k];
            m = m.max(*v);
        }
        let mut sum = 0.0f32;
        for v in row.iter_mut() {
            *v = transcend::exp(*v - m);
            sum += *v;
        }
        let inv = 1.0 / sum;
        for v in row.iter_mut() {
            *v = *v * inv + eps;
        }
    }
    normalize_columns(c, n, eps);
    for _ in 1..iters {
        normalize_rows(c, n, eps);
        normalize_columns(c, n, eps);
    }
}

fn normalize_rows(c: &mut [f32], n: usize, eps: f32) {
    for row in c.chunks_exact_mut(n) {
        let inv = 1.0 / (row.iter().sum::<f32>() + eps);
        row.iter_mut().for_each(|v| *v *= inv);
    }
}

fn normalize_columns(c: &mut [f32], n: usize, eps: f32) {
    for dst in 0..n {
        let sum: f32 = (0..n).map(|src| c[src * n + dst]).sum();
        let inv = 1.0 / (sum + eps);
        for src in 0..n {
            c[src * n + dst] *= inv;
        }
    }
}

/// out[d] = Σ_h w[h]·x[h·E + d] (stream-major HC state).
pub fn weighted_sum(out: &mut [f32], x: &[f32], w: &[f32], n_embd: usize) {
    for d in 0..n_embd {
        let mut acc = 0.0f32;
        for (h, &wh) in w.iter().enumerate() {
            acc += x[h * n_embd + d] * wh;
        }
        out[d] = acc;
    }
}

/// HC post (docs/model.md#hc-post): new[dst][d] = post[dst]·y[d] + Σ_src comb[src·n + dst]·old[src][d].
pub fn post(out: &mut [f32], y: &[f32], residual: &[f32], post: &[f32], comb: &[f32], n_embd: usize) {
    let n = post.len();
    for dst in 0..n {
        let o = &mut out[dst * n_embd..(dst + 1) * n_embd];
        for d in 0..n_embd {
            let mut acc = y[d] * post[dst];
            for src in 0..n {
                acc += comb[src * n + dst] * residual[src * n_embd + d];
            }
            o[d] = acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 2×2 example worked by hand: mix = 0, base = 0 except comb logits (ln 3, 0 / 0, 0), scales 1.
    /// Softmax rows: (3/4, 1/4), (1/2, 1/2). With eps = 0 Sinkhorn converges to a doubly stochastic
    /// matrix; with one iteration only the column pass applies: col sums (5/4, 3/4) →
    /// ((3/5, 1/3), (2/5, 2/3)).
    #[test]
    fn sinkhorn_hand_example() {
        let n = 2;
        let mix = [0.0f32; 8];
        let mut base = [0.0f32; 8];
        base[4] = 3.0f32.ln();
        let (mut pre, mut post, mut comb) = ([0.0; 2], [0.0; 2], [0.0; 4]);
        split_sinkhorn(&mix, &[1.0, 1.0, 1.0], &base, n, 1, 0.0, &mut pre, &mut post, &mut comb);
        assert_eq!(pre, [0.5, 0.5]);
        assert_eq!(post, [1.0, 1.0]);
        let want = [3.0 / 5.0, 1.0 / 3.0, 2.0 / 5.0, 2.0 / 3.0];
        for (a, b) in comb.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{comb:?}");
        }
        // Second iteration: rows of the above sum to (14/15, 16/15) → divide, then columns again.
        split_sinkhorn(&mix, &[1.0, 1.0, 1.0], &base, n, 2, 0.0, &mut pre, &mut post, &mut comb);
        let r = [
            (3.0 / 5.0) / (14.0 / 15.0),
            (1.0 / 3.0) / (14.0 / 15.0),
            (2.0 / 5.0) / (16.0 / 15.0),
            (2.0 / 3.0) / (16.0 / 15.0),
        ];
        let c0 = r[0] + r[2];
        let c1 = r[1] + r[3];
        let want2 = [r[0] / c0, r[1] / c1, r[2] / c0, r[3] / c1];
        for (a, b) in comb.iter().zip(want2) {
            assert!((a - b).abs() < 1e-6, "{comb:?} vs {want2:?}");
        }
    }

    /// With 20 iterations a random 4×4 start is doubly stochastic to ~1e-6 (the eps terms bias it by
    /// ~n·eps), and 19 iterations give a measurably different matrix (the vectors cannot see this).
    #[test]
    fn sinkhorn_twenty_iterations_is_doubly_stochastic() {
        let n = 4;
        let mix: Vec<f32> = (0..24).map(|i| ((i * 7919 % 23) as f32 - 11.0) * 0.31).collect();
        let base: Vec<f32> = (0..24).map(|i| ((i * 31 % 13) as f32 - 6.0) * 0.2).collect();
        let (mut pre, mut post, mut c20, mut c19) = ([0.0; 4], [0.0; 4], [0.0; 16], [0.0; 16]);
        split_sinkhorn(
            &mix,
            &[1.0, 1.0, 1.0],
            &base,
            n,
            20,
            1e-6,
            &mut pre,
            &mut post,
            &mut c20,
        );
        split_sinkhorn(
            &mix,
            &[1.0, 1.0, 1.0],
            &base,
            n,
            19,
            1e-6,
            &mut pre,
            &mut post,
            &mut c19,
        );
        for i in 0..n {
            let row: f32 = (0..n).map(|j| c20[i * n + j]).sum();
            let col: f32 = (0..n).map(|j| c20[j * n + i]).sum();
            assert!((row - 1.0).abs() < 1e-4, "row {i} sums to {row}");
            assert!((col - 1.0).abs() < 1e-5, "col {i} sums to {col}");
        }
        assert!(c20.iter().zip(&c19).any(|(a, b)| a != b));
    }

    #[test]
    fn post_mixes_src_into_dst() {
        // comb[src·n+dst]: stream 0 receives 1·old[1], stream 1 receives 1·old[0].
        let comb = [0.0, 1.0, 1.0, 0.0];
        let old = [1.0, 2.0]; // E = 1: old[0]=1, old[1]=2
        let mut out = [0.0; 2];
        post(&mut out, &[10.0], &old, &[0.5, 0.25], &comb, 1);
        assert_eq!(out, [5.0 + 2.0, 2.5 + 1.0]);
    }
}
