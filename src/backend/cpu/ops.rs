//! Elementwise and per-row operations of the forward pass: RMSNorm (docs/model.md#rmsnorm), tail RoPE with YaRN
//! (docs/model.md#rope-and-yarn), the E4M3 / E2M1 round trips and the 128-point Hadamard
//! (docs/model.md#fp8-and-fp4-simulations), and the small activations.
//!
//! Owns only math on slices; no weights, no cache, no threading.

use crate::model::hparams::HParams;

use super::reduce;
use super::transcend;

/// RMSNorm with the sum of squares accumulated in double (docs/model.md#rmsnorm) in the block order shared with
/// the kernels (`reduce`); `w` None = no weight.
pub fn rms_norm(out: &mut [f32], x: &[f32], w: Option<&[f32]>, eps: f32) {
    let ss = reduce::sum_squares_f64(x);
    let scale = 1.0 / ((ss / x.len() as f64) as f32 + eps).sqrt();
    match w {
        Some(w) => {
            for i in 0..x.len() {
                out[i] = x[i] * scale * w[i];
            }
        }
        None => {
            for i in 0..x.len() {
                out[i] = x[i] * scale;
            }
        }
    }
}

/// [`rms_norm`] of each of the first `n` rows of `width` values of `x` into the same rows of `out`.
pub fn rms_norm_rows(out: &mut [f32], x: &[f32], w: Option<&[f32]>, eps: f32, width: usize, n: usize) {
    let rows = out[..n * width]
        .chunks_exact_mut(width)
        .zip(x[..n * width].chunks_exact(width));
    for (o, xr) in rows {
        rms_norm(o, xr, w, eps);
    }
}

/// In-place RMSNorm.
pub fn rms_norm_inplace(x: &mut [f32], w: Option<&[f32]>, eps: f32) {
    let ss = reduce::sum_squares_f64(x);
    let scale = 1.0 / ((ss / x.len() as f64) as f32 + eps).sqrt();
    match w {
        Some(w) => x.iter_mut().zip(w).for_each(|(v, &wi)| *v = *v * scale * wi),
        None => x.iter_mut().for_each(|v| *v *= scale),
    }
}

/// Plain sigmoid 1/(1+e^−z) (HC split, docs/model.md#hc-pre).
#[inline]
pub fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + transcend::exp(-z))
}

/// Overflow-safe sigmoid (output head weights, SiLU).
#[inline]
pub fn sigmoid_stable(z: f32) -> f32 {
    if z >= 0.0 {
        1.0 / (1.0 + transcend::exp(-z))
    } else {
        let e = transcend::exp(z);
        e / (1.0 + e)
    }
}

#[inline]
pub fn silu(z: f32) -> f32 {
    z * sigmoid_stable(z)
}

/// softplus with the ±20 cut-offs of ds4's router (docs/model.md#router).
#[inline]
pub fn softplus(z: f32) -> f32 {
    if z > 20.0 {
        z
    } else if z < -20.0 {
        transcend::exp(z)
    } else {
        transcend::ln_1p(transcend::exp(z))
    }
}

/// The angle terms of a RoPE flavour, computed once here for the CPU engine and the
/// device kernels (`kernels::RopeParams`), so both rotate by the same floats.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeTerms {
    /// base^(-2/n_rot): the ratio of successive pair frequencies.
    pub theta_scale: f32,
    pub freq_scale: f32,
    /// YaRN on: (low, high) correction dims of the ramp.
    pub yarn: Option<(f32, f32)>,
    /// Factor on cos and sin.
    pub mscale: f32,
}

impl RopeTerms {
    /// Plain rotation with `base`.
    pub fn plain(n_rot: usize, base: f32) -> RopeTerms {
        RopeTerms {
            theta_scale: base.powf(-2.0 / n_rot as f32),
            freq_scale: 1.0,
            yarn: None,
            mscale: 1.0,
        }
    }

    /// Frequency scale 1/`factor` and the YaRN ramp between the correction dims of `beta_fast` and
    /// `beta_slow` for a training context of `orig_ctx` tokens.
    pub fn yarn(n_rot: usize, base: f32, factor: f32, orig_ctx: u64, beta_fast: f32, beta_slow: f32) -> RopeTerms {
        let freq_scale = 1.0 / factor;
        let corr =
            |beta: f32| n_rot as f32 * (orig_ctx as f32 / (beta * 2.0 * std::f32::consts::PI)).ln() / (2.0 * base.ln());
        let low = corr(beta_fast).floor().max(0.0);
        let high = corr(beta_slow).ceil().min((n_rot - 1) as f32);
        // ds4 hands the helper the inverse of the YaRN magnitude factor so that the two cancel;
        // doing the same two float operations keeps the product exactly what ds4 uses.
        let m = 1.0 + 0.1 * (1.0 / freq_scale).ln();
        RopeTerms {
            theta_scale: base.powf(-2.0 / n_rot as f32),
            freq_scale,
            yarn: Some((low, high)),
            mscale: (1.0 / m) * m,
        }
    }
}

/// The RoPE flavour of one layer (docs/model.md#rope-and-yarn): base, frequency scale and the YaRN ramp.
#[derive(Clone, Copy, Debug)]
pub struct Rope {
    pub n_rot: usize,
    pub terms: RopeTerms,
}

impl Rope {
    /// Dense layers: base `rope_freq_base`, no scaling. Compressed layers (and their indexer): base
    /// `compress_rope_freq_base`, frequency scale 1/factor and the YaRN blend; magnitude stays 1.
    pub fn for_layer(hp: &HParams, compressed: bool) -> Rope {
        let n_rot = hp.n_rot;
        let base = if compressed && hp.compress_rope_freq_base > 0.0 {
            hp.compress_rope_freq_base
        } else {
            hp.rope_freq_base
        };
        let terms = if compressed && hp.rope_scaling_factor > 1.0 {
            RopeTerms::yarn(
                n_rot,
                base,
                hp.rope_scaling_factor,
                hp.rope_orig_ctx,
                hp.yarn_beta_fast,
                hp.yarn_beta_slow,
            )
        } else {
            RopeTerms::plain(n_rot, base)
        };
        Rope { n_rot, terms }
    }

    /// Rotate the last `n_rot` dims of each `head_dim`-wide head of `x` at position `pos`,
    /// interleaved pairs; `inverse` rotates back.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, pos: usize, inverse: bool) {
        let t = &self.terms;
        let sign = if inverse { -1.0 } else { 1.0 };
        let n_nope = head_dim - self.n_rot;
        for head in x.chunks_exact_mut(head_dim) {
            let tail = &mut head[n_nope..];
            // θ by iterated product, as the reference does (bit-level agreement of the angles).
            let mut theta_extrap = pos as f32;
            for k in 0..self.n_rot / 2 {
                let theta_interp = t.freq_scale * theta_extrap;
                let theta = match t.yarn {
                    Some((low, high)) => {
                        let y = (k as f32 - low) / (high - low).max(0.001);
                        let ramp = 1.0 - y.clamp(0.0, 1.0);
                        theta_interp * (1.0 - ramp) + theta_extrap * ramp
                    }
                    None => theta_interp,
                };
                let c = transcend::cos(theta) * t.mscale;
                let s = sign * transcend::sin(theta) * t.mscale;
                let x0 = tail[2 * k];
                let x1 = tail[2 * k + 1];
                tail[2 * k] = x0 * c - x1 * s;
                tail[2 * k + 1] = x0 * s + x1 * c;
                theta_extrap *= t.theta_scale;
            }
        }
    }
}

/// E4M3FN value of code `i` (0..=126): exponent i>>3, mantissa i&7, bias 7, subnormals below.
pub fn e4m3_value(i: usize) -> f32 {
    let e = (i >> 3) & 15;
    let m = (i & 7) as f32;
    if e == 0 {
        m * (1.0 / 512.0)
    } else {
        (1.0 + m / 8.0) * (2.0f32).powi(e as i32 - 7)
    }
}

fn e4m3_table() -> &'static [f32; 127] {
    static T: std::sync::OnceLock<[f32; 127]> = std::sync::OnceLock::new();
    T.get_or_init(|| std::array::from_fn(e4m3_value))
}

/// Nearest E4M3FN value (ties to the even code), sign kept, magnitude clamped to 448.
pub fn e4m3_round(x: f32) -> f32 {
    let t = e4m3_table();
    let sign = if x < 0.0 { -1.0 } else { 1.0 };
    let ax = x.abs().min(448.0);
    // Largest code whose value is ≤ ax.
    let lo = t.partition_point(|&v| v <= ax).saturating_sub(1);
    let mut best = lo;
    if lo < 126 {
        let d0 = (ax - t[lo]).abs();
        let d1 = (ax - t[lo + 1]).abs();
        if d1 < d0 || (d1 == d0 && (lo + 1).is_multiple_of(2)) {
            best = lo + 1;
        }
    }
    sign * t[best]
}

/// Power-of-two block scale 2^ceil(log2(amax/limit)); the division is taken as a multiplication by
/// the f32 reciprocal, as ds4's -ffast-math build computes it.
#[inline]
fn pow2_scale(amax: f32, limit: f32) -> f32 {
    let rcp = (1.0f64 / limit as f64) as f32;
    let e = transcend::log2(amax * rcp).ceil() as i32;
    (2.0f32).powi(e)
}

/// E4M3 round trip of the first `n_nope` dims of a KV row, per 64-element block
/// (docs/model.md#fp8-and-fp4-simulations).
pub fn fp8_kv_round_trip(row: &mut [f32], n_nope: usize) {
    for blk in row[..n_nope].chunks_mut(64) {
        let amax = blk.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1.0e-4);
        let scale = pow2_scale(amax, 448.0);
        for v in blk.iter_mut() {
            let q = (*v / scale).clamp(-448.0, 448.0);
            *v = e4m3_round(q) * scale;
        }
    }
}

/// The E2M1 (FP4) magnitudes in code order.
pub const E2M1_VALUES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Nearest E2M1 value, ties to the even code, sign kept, magnitude clamped to 6.
pub fn e2m1_round(x: f32) -> f32 {
    let sign = if x < 0.0 { -1.0 } else { 1.0 };
    let ax = x.abs().min(6.0);
    let mut best = 0usize;
    let mut best_d = ax;
    for (i, &v) in E2M1_VALUES.iter().enumerate().skip(1) {
        let d = (ax - v).abs();
        if d < best_d || (d == best_d && i % 2 == 0 && best % 2 == 1) {
            best = i;
            best_d = d;
        }
    }
    sign * E2M1_VALUES[best]
}

/// FP4 round trip per 32-element block with a power-of-two scale (docs/model.md#fp8-and-fp4-simulations).
pub fn fp4_round_trip(row: &mut [f32]) {
    for blk in row.chunks_mut(32) {
        let amax = blk.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(7.052_966e-38);
        let scale = pow2_scale(amax, 6.0);
        for v in blk.iter_mut() {
            let q = (*v / scale).clamp(-6.0, 6.0);
            *v = e2m1_round(q) * scale;
        }
    }
}

/// In-place Sylvester-order Walsh–Hadamard transform scaled by 1/sqrt(n) (n a power of two).
pub fn hadamard_inplace(x: &mut [f32]) {
    let n = x.len();
    let mut stride = 1;
    while stride < n {
        for base in (0..n).step_by(2 * stride) {
            for i in base..base + stride {
                let a = x[i];
                let b = x[i + stride];
                x[i] = a + b;
                x[i + stride] = a - b;
            }
        }
        stride <<= 1;
    }
    // ds4 multiplies by the f32 constant 1/sqrt(128); for other widths use the same formula.
    let s = (1.0f64 / (n as f64).sqrt()) as f32;
    x.iter_mut().for_each(|v| *v *= s);
}

/// Indexer activation simulation (docs/model.md#fp8-and-fp4-simulations): Hadamard then FP4, per head row.
pub fn indexer_qat(row: &mut [f32]) {
    hadamard_inplace(row);
    fp4_round_trip(row);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_table_matches_format() {
        // Max normal 448 = 1.75·2^8 is code 126; smallest subnormal 2^-9.
        assert_eq!(e4m3_value(126), 448.0);
        assert_eq!(e4m3_value(1), 2f32.powi(-9));
        assert_eq!(e4m3_value(8), 2f32.powi(-6));
        // Ties: 1.0625 lies halfway between 1.0 (code 56) and 1.125 (code 57) → even code 56.
        assert_eq!(e4m3_round(1.0625), 1.0);
        // 1.1875 is halfway between 1.125 (57) and 1.25 (58) → 58.
        assert_eq!(e4m3_round(1.1875), 1.25);
        assert_eq!(e4m3_round(-500.0), -448.0);
        assert_eq!(e4m3_round(0.0), 0.0);
    }

    #[test]
    fn e2m1_rounds_ties_to_even_code() {
        assert_eq!(e2m1_round(0.25), 0.0); // between codes 0 and 1 → 0
        assert_eq!(e2m1_round(0.75), 1.0); // between 1 (0.5) and 2 (1.0) → code 2
        assert_eq!(e2m1_round(2.5), 2.0); // between 4 (2.0) and 5 (3.0) → code 4
        assert_eq!(e2m1_round(5.0), 4.0); // between code 6 (4.0) and code 7 (6.0) → code 6
        assert_eq!(e2m1_round(-7.0), -6.0);
    }

    #[test]
    fn hadamard_is_orthonormal_and_matches_definition() {
        // H_n[i][j] = (−1)^popcount(i & j) / sqrt(n) in Sylvester order.
        let n = 128;
        let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.1).collect();
        let mut y = x.clone();
        hadamard_inplace(&mut y);
        for (i, &yi) in y.iter().enumerate() {
            let want: f64 = (0..n)
                .map(|j| {
                    if (i & j).count_ones() % 2 == 0 {
                        x[j] as f64
                    } else {
                        -x[j] as f64
                    }
                })
                .sum::<f64>()
                / (n as f64).sqrt();
            assert!((yi as f64 - want).abs() < 1e-5, "{i}: {yi} vs {want}");
        }
        hadamard_inplace(&mut y);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 1e-5);
        }
    }

    #[test]
    fn rms_norm_unit_rms() {
        let x = [3.0f32, 4.0];
        let mut o = [0.0; 2];
        rms_norm(&mut o, &x, None, 0.0);
        // rms of (3,4) = sqrt(12.5)
        assert!((o[0] - 3.0 / 12.5f32.sqrt()).abs() < 1e-6);
    }

    #[test]
    fn rope_yarn_corr_dims_for_flash() {
        let r = Rope::for_layer(&HParams::flash(), true);
        assert_eq!(r.terms.yarn, Some((15.0, 25.0)));
        assert_eq!(r.terms.mscale, 1.0);
        // Forward then inverse is the identity (rotation).
        let mut x: Vec<f32> = (0..128).map(|i| (i as f32 * 0.37).sin()).collect();
        let orig = x.clone();
        r.apply(&mut x, 128, 1234, false);
        r.apply(&mut x, 128, 1234, true);
        for (a, b) in x.iter().zip(&orig) {
            assert!((a - b).abs() < 1e-4);
        }
        // Dims before the tail are untouched.
        assert_eq!(&x[..64], &orig[..64]);
    }
}
