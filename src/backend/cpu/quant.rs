//! Activation quantization (Q8_0, Q8_K) and the row dot products of the CPU reference (docs/arithmetic.md).
//!
//! Owns the weight-row × activation kernels: Q8_0·Q8_0, F16·f32, IQ2_XXS·Q8_K, Q2_K·Q8_K, Q4_K·Q8_K.
//! Each kernel reads one weight row straight from the mapped file bytes. Must not allocate or know
//! about layers; the matvec drivers in `matvec.rs` call these per output row.

use std::sync::OnceLock;

use crate::gguf::half::f16_to_f32;
use crate::gguf::iq2_tables::{IQ2XXS_GRID, ksigns_iq2xs};

/// Elements per Q8_0 block.
pub const QK8_0: usize = 32;
/// Elements per K-quant super-block.
pub const QK_K: usize = 256;

/// f16 → f32 through a 64K-entry table (the F16 matvecs convert every weight they touch).
pub fn f16_table() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(f16_to_f32).collect())
}

#[inline]
fn le_f16(t: &[f32], b: &[u8], off: usize) -> f32 {
    t[u16::from_le_bytes([b[off], b[off + 1]]) as usize]
}

/// Round half to even, as C's `lrintf` in the default rounding mode. For |x| < 2^22 adding and
/// removing 1.5·2^23 rounds exactly that way (IEEE round-to-nearest-even addition) without a libm
/// call; larger magnitudes (never produced by the quantizers, which clamp to ±128) fall back.
#[inline]
fn lrint(x: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    if x.abs() < 4_194_304.0 {
        ((x + MAGIC) - MAGIC) as i32
    } else {
        x.round_ties_even() as i32
    }
}

/// A Q8_0-quantized activation row: per 32 elements an f32 scale (not f16-rounded) and int8 codes.
#[derive(Clone, Debug, Default)]
pub struct Q8_0Act {
    pub qs: Vec<i8>,
    pub scales: Vec<f32>,
}

impl Q8_0Act {
    pub fn with_len(n: usize) -> Q8_0Act {
        let nb = n.div_ceil(QK8_0);
        Q8_0Act {
            qs: vec![0; nb * QK8_0],
            scales: vec![0.0; nb],
        }
    }
}

/// 1/127 rounded to f32. ds4 is compiled with -ffast-math, which turns its `amax / 127` into
/// `amax * (1/127)` and `1 / d` into `127 / amax` (checked in the x86 assembly gcc emits); doing
/// the same keeps our int8 codes on the same side of every rounding boundary.
const RCP127: f32 = (1.0f64 / 127.0) as f32;

/// Q8_0 activation quantization (docs/arithmetic.md#activation-quantization): d = amax/127,
/// q = clamp(rint(x/d)) — evaluated as d = amax·(1/127), x·(127/amax) like the reference binary. A trailing
/// partial block is zero padded.
/// `out` must have been made with `Q8_0Act::with_len(x.len())` or larger.
pub fn quantize_q8_0(x: &[f32], out: &mut Q8_0Act) {
    let nb = x.len().div_ceil(QK8_0);
    for b in 0..nb {
        let lo = b * QK8_0;
        let hi = (lo + QK8_0).min(x.len());
        let blk = &x[lo..hi];
        let amax = blk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax * RCP127;
        let id = if d != 0.0 { 127.0 / amax } else { 0.0 };
        out.scales[b] = d;
        let q = &mut out.qs[lo..lo + QK8_0];
        for (i, qv) in q.iter_mut().enumerate() {
            let v = if i < blk.len() { blk[i] } else { 0.0 };
            *qv = lrint(v * id).clamp(-128, 127) as i8;
        }
    }
}

/// One Q8_K activation block (docs/gguf.md#q8_k): signed scale, 256 codes, sums of each 16 codes.
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

impl Default for BlockQ8K {
    fn default() -> Self {
        BlockQ8K {
            d: 0.0,
            qs: [0; QK_K],
            bsums: [0; QK_K / 16],
        }
    }
}

/// Q8_K activation quantization (docs/arithmetic.md#activation-quantization): the largest-magnitude element
/// (first on ties) maps to −127.
pub fn quantize_q8_k(x: &[f32], out: &mut [BlockQ8K]) {
    debug_assert!(x.len().is_multiple_of(QK_K));
    for (blk, y) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in blk {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *y = BlockQ8K::default();
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in y.qs.iter_mut().zip(blk) {
            *q = lrint(iscale * v).clamp(-128, 127) as i8;
        }
        for (s, chunk) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
            *s = chunk.iter().map(|&q| q as i16).sum();
        }
        // d = 1/iscale, which the reference binary evaluates as max·(−1/127).
        y.d = max * -RCP127;
    }
}

#[inline]
fn isum_u8_i8(w: &[u8], x: &[i8]) -> i32 {
    // The weight codes are int8 stored as raw bytes.
    w.iter().zip(x).map(|(&a, &b)| a as i8 as i32 * b as i32).sum()
}

/// Q8_0 weight row · Q8_0 activation (docs/arithmetic.md#dot-products): int32 block sums, float outer
/// accumulation.
/// `xq`/`xs` are the codes and scales of the activation blocks this row reads (a group's slice for
/// the grouped output projection).
pub fn dot_q8_0(row: &[u8], xq: &[i8], xs: &[f32]) -> f32 {
    let t = f16_table();
    let mut acc = 0.0f32;
    for (b, blk) in row.chunks_exact(34).enumerate() {
        let dw = le_f16(t, blk, 0);
        let q = &xq[b * QK8_0..(b + 1) * QK8_0];
        acc += dw * xs[b] * isum_u8_i8(&blk[2..], q) as f32;
    }
    acc
}

/// F16 weight row · f32 activation (docs/arithmetic.md#dot-products): one sequential float accumulator,
/// multiply then add — the order ds4's x86 build executes (its f16 conversion keeps the loop scalar). The
/// kernels reproduce this chain (a tree order instead moves the case A vectors outside their tolerance).
pub fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    let t = f16_table();
    let mut acc = 0.0f32;
    for (i, &xv) in x.iter().enumerate() {
        acc += le_f16(t, row, 2 * i) * xv;
    }
    acc
}

/// f32 dot product (attention and indexer scores) in the order of an 8-lane vectorized reduction:
/// lane k sums elements ≡ k (mod 8), then the lanes fold as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)),
/// and a tail is added last. This is how ds4's scalar loop compiles with -O3 -ffast-math on AVX2;
/// matching it keeps our activations a few ulps closer to the reference.
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut l = [0.0f32; 8];
    let n = a.len().min(b.len());
    let full = n / 8 * 8;
    for i in (0..full).step_by(8) {
        for k in 0..8 {
            l[k] += a[i + k] * b[i + k];
        }
    }
    let s = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    let mut acc = (s[0] + s[2]) + (s[1] + s[3]);
    for i in full..n {
        acc = a[i].mul_add(b[i], acc);
    }
    acc
}

/// y += a·x with fused multiply-adds (ds4's axpy contracts to FMA).
#[inline]
pub fn axpy_fma(y: &mut [f32], x: &[f32], a: f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports FMA (checked just above).
            unsafe { axpy_fma_x86(y, x, a) };
            return;
        }
    }
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv = a.mul_add(xv, *yv);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn axpy_fma_x86(y: &mut [f32], x: &[f32], a: f32) {
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv = a.mul_add(xv, *yv);
    }
}

/// The IQ2_XXS grid as signed bytes, one row of 8 per grid index.
fn iq2_grid_bytes() -> &'static [[i8; 8]; 256] {
    static G: OnceLock<[[i8; 8]; 256]> = OnceLock::new();
    G.get_or_init(|| std::array::from_fn(|i| IQ2XXS_GRID[i].to_le_bytes().map(|b| b as i8)))
}

/// The 128 sign patterns of `ksigns_iq2xs` as ±1 per element.
fn iq2_sign_rows() -> &'static [[i8; 8]; 128] {
    static S: OnceLock<[[i8; 8]; 128]> = OnceLock::new();
    S.get_or_init(|| {
        std::array::from_fn(|s| {
            let bits = ksigns_iq2xs(s as u8);
            std::array::from_fn(|j| if bits & (1 << j) != 0 { -1 } else { 1 })
        })
    })
}

/// IQ2_XXS weight row · Q8_K activation (docs/arithmetic.md#dot-products): Σ (2·ls+1)·Σ(±grid·q8) per 32, ×
/// d·y.d, × 1/8. (Checked bit-identical to ds4's x86 -O3 -ffast-math build on 2000 random 3-block rows.)
pub fn dot_iq2_xxs(row: &[u8], x: &[BlockQ8K]) -> f32 {
    let t = f16_table();
    let grid = iq2_grid_bytes();
    let signs = iq2_sign_rows();
    let mut acc = 0.0f32;
    for (blk, y) in row.chunks_exact(66).zip(x) {
        let d = le_f16(t, blk, 0) * y.d;
        let qs = &blk[2..];
        let mut bsum = 0i32;
        for ib in 0..8 {
            let a0 = &qs[8 * ib..8 * ib + 4];
            let a1 = u32::from_le_bytes([qs[8 * ib + 4], qs[8 * ib + 5], qs[8 * ib + 6], qs[8 * ib + 7]]);
            let ls = (a1 >> 28) as i32;
            let q8 = &y.qs[32 * ib..32 * ib + 32];
            let mut sumi = 0i32;
            for k in 0..4 {
                let g = &grid[a0[k] as usize];
                let sg = &signs[((a1 >> (7 * k)) & 127) as usize];
                let q = &q8[8 * k..8 * k + 8];
                for j in 0..8 {
                    sumi += (g[j] * sg[j]) as i32 * q[j] as i32;
                }
            }
            bsum += sumi * (2 * ls + 1);
        }
        acc += d * bsum as f32;
    }
    acc * 0.125
}

/// Q2_K weight row · Q8_K activation (docs/arithmetic.md#dot-products).
pub fn dot_q2_k(row: &[u8], x: &[BlockQ8K]) -> f32 {
    let t = f16_table();
    let mut acc = 0.0f32;
    for (blk, y) in row.chunks_exact(84).zip(x) {
        let scales = &blk[0..16];
        let qs = &blk[16..80];
        let d = le_f16(t, blk, 80);
        let dmin = le_f16(t, blk, 82);
        let mut summs = 0i32;
        for (&b, &sc) in y.bsums.iter().zip(scales) {
            summs += b as i32 * (sc >> 4) as i32;
        }
        let mut isum = 0i32;
        for k in 0..2 {
            for j in 0..4 {
                for half in 0..2 {
                    let s = 8 * k + 2 * j + half;
                    let mut sub = 0i32;
                    for l in 16 * half..16 * half + 16 {
                        let q = ((qs[32 * k + l] >> (2 * j)) & 3) as i32;
                        sub += q * y.qs[128 * k + 32 * j + l] as i32;
                    }
                    isum += (scales[s] & 15) as i32 * sub;
                }
            }
        }
        // Grouped as ds4's x86 build computes it (checked bit for bit against the compiled
        // reference): fma(isum, y.d·d, −(summs·y.d)·dmin).
        acc += (isum as f32).mul_add(y.d * d, -((summs as f32 * y.d) * dmin));
    }
    acc
}

/// 6-bit scale and min of Q4_K sub-block `j` (docs/gguf.md#block-formats): the format's own unpacking.
pub use crate::gguf::dequant::q4_k_scale_min;

/// Q4_K weight row · Q8_K activation (docs/arithmetic.md#dot-products, the CUDA formula; ds4's CPU path has
/// none).
pub fn dot_q4_k(row: &[u8], x: &[BlockQ8K]) -> f32 {
    let t = f16_table();
    let mut acc = 0.0f32;
    for (blk, y) in row.chunks_exact(144).zip(x) {
        let d = le_f16(t, blk, 0);
        let dmin = le_f16(t, blk, 2);
        let scales = &blk[4..16];
        let qs = &blk[16..144];
        let mut isum = 0i32;
        let mut summs = 0i32;
        for c in 0..4 {
            for h in 0..2 {
                let j = 2 * c + h;
                let (sc, m) = q4_k_scale_min(scales, j);
                let mut sub = 0i32;
                for l in 0..32 {
                    let b = qs[32 * c + l];
                    let q = if h == 0 { b & 15 } else { b >> 4 } as i32;
                    sub += q * y.qs[64 * c + 32 * h + l] as i32;
                }
                isum += sc as i32 * sub;
                summs += m as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32);
            }
        }
        acc += y.d * d * isum as f32 - y.d * dmin * summs as f32;
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgmlType;
    use crate::gguf::half::f32_to_f16;

    /// Deterministic pseudo-random bytes (xorshift).
    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        }
    }

    fn rand_f32s(n: usize, seed: u64) -> Vec<f32> {
        let mut r = rng(seed);
        (0..n).map(|_| ((r() % 20001) as f32 / 10000.0 - 1.0) * 3.0).collect()
    }

    fn put_f16(b: &mut [u8], v: f32) {
        b.copy_from_slice(&f32_to_f16(v).to_le_bytes());
    }

    // Reference dequantization: gguf::dequant, proven bit-exact against the `gguf` Python package.
    fn deq(ty: GgmlType, blk: &[u8]) -> Vec<f32> {
        crate::gguf::dequant::dequantize(ty, blk, 256).unwrap()
    }
    fn deq_q2_k(blk: &[u8]) -> Vec<f32> {
        deq(GgmlType::Q2K, blk)
    }
    fn deq_q4_k(blk: &[u8]) -> Vec<f32> {
        deq(GgmlType::Q4K, blk)
    }
    fn deq_iq2_xxs(blk: &[u8]) -> Vec<f32> {
        deq(GgmlType::Iq2Xxs, blk)
    }

    fn deq_q8k(b: &[BlockQ8K]) -> Vec<f32> {
        b.iter()
            .flat_map(|blk| blk.qs.iter().map(move |&q| blk.d * q as f32))
            .collect()
    }

    /// Each K-quant dot product equals the f32 dot of the dequantized weights with the dequantized
    /// Q8_K activation (only float summation order differs: relative 1e-5 of Σ|w·x|), and is within the
    /// activation quantization error (half a step per element: Σ|w|·|d|/2) of the unquantized dot.
    #[test]
    fn k_quant_dots_match_dequantized_reference() {
        let n = 512;
        let x = rand_f32s(n, 7);
        let mut xq = vec![BlockQ8K::default(); n / QK_K];
        quantize_q8_k(&x, &mut xq);
        let xd = deq_q8k(&xq);
        // The extreme element maps to −127 exactly and bsums are the code sums.
        for b in &xq {
            assert!(b.qs.contains(&-127));
            assert_eq!(b.bsums[3], b.qs[48..64].iter().map(|&q| q as i16).sum::<i16>());
        }
        type Deq = fn(&[u8]) -> Vec<f32>;
        type Dot = fn(&[u8], &[BlockQ8K]) -> f32;
        let cases: [(&str, usize, Deq, Dot); 3] = [
            ("Q2_K", 84, deq_q2_k, dot_q2_k),
            ("Q4_K", 144, deq_q4_k, dot_q4_k),
            ("IQ2_XXS", 66, deq_iq2_xxs, dot_iq2_xxs),
        ];
        for (name, bb, deq, dot) in cases {
            for seed in 0..20u64 {
                let mut r = rng(seed + 100);
                let mut row: Vec<u8> = (0..bb * n / QK_K).map(|_| r() as u8).collect();
                for blk in row.chunks_exact_mut(bb) {
                    let d = 0.001 + (r() % 1000) as f32 * 1e-5;
                    match name {
                        "Q2_K" => {
                            put_f16(&mut blk[80..82], d);
                            put_f16(&mut blk[82..84], d * 0.7);
                        }
                        "Q4_K" => {
                            put_f16(&mut blk[0..2], d);
                            put_f16(&mut blk[2..4], d * 0.5);
                        }
                        _ => put_f16(&mut blk[0..2], d),
                    }
                }
                let w: Vec<f32> = row.chunks_exact(bb).flat_map(deq).collect();
                let got = dot(&row, &xq) as f64;
                let exact: f64 = w.iter().zip(&xd).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = w.iter().zip(&xd).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                assert!(
                    (got - exact).abs() <= 1e-5 * mag + 1e-9,
                    "{name} seed {seed}: {got} vs {exact}"
                );
                let plain: f64 = w.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
                let step: f64 = w
                    .iter()
                    .enumerate()
                    .map(|(i, &a)| a.abs() as f64 * xq[i / QK_K].d.abs() as f64 * 0.5)
                    .sum();
                assert!(
                    (got - plain).abs() <= step * 1.001 + 1e-6,
                    "{name} seed {seed}: {got} vs {plain}"
                );
            }
        }
    }

    /// Q8_0 · Q8_0 and F16 · f32 against dequantize-then-dot.
    #[test]
    fn q8_0_and_f16_dots_match_reference() {
        let n = 256;
        let x = rand_f32s(n, 3);
        let mut xq = Q8_0Act::with_len(n);
        quantize_q8_0(&x, &mut xq);
        let mut r = rng(11);
        let mut row: Vec<u8> = (0..34 * n / 32).map(|_| r() as u8).collect();
        for blk in row.chunks_exact_mut(34) {
            put_f16(&mut blk[0..2], 0.002 + (r() % 100) as f32 * 1e-4);
        }
        let w: Vec<f32> = row
            .chunks_exact(34)
            .flat_map(|b| {
                let d = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                b[2..].iter().map(move |&q| d * q as i8 as f32)
            })
            .collect();
        let xd: Vec<f32> = (0..n).map(|i| xq.scales[i / 32] * xq.qs[i] as f32).collect();
        let got = dot_q8_0(&row, &xq.qs, &xq.scales) as f64;
        let exact: f64 = w.iter().zip(&xd).map(|(&a, &b)| a as f64 * b as f64).sum();
        let mag: f64 = w.iter().zip(&xd).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
        assert!((got - exact).abs() <= 1e-5 * mag);
        // Q8_0 codes: the block maximum maps to ±127 and the scale is not f16-rounded.
        let amax = x[..32].iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert_eq!(xq.scales[0], amax * RCP127);
        assert!((xq.scales[0] - amax / 127.0).abs() <= f32::EPSILON * amax / 127.0);

        let hw: Vec<f32> = rand_f32s(n, 5);
        let mut h = vec![0u8; 2 * n];
        for (i, &v) in hw.iter().enumerate() {
            put_f16(&mut h[2 * i..2 * i + 2], v);
        }
        let want: f64 = (0..n)
            .map(|i| crate::gguf::half::round_f16(hw[i]) as f64 * x[i] as f64)
            .sum();
        let mag: f64 = (0..n).map(|i| (hw[i] as f64 * x[i] as f64).abs()).sum();
        assert!((dot_f16(&h, &x) as f64 - want).abs() <= 1e-5 * mag);
    }

    /// The reciprocal constant is the one in ds4's compiled quantizers (f32 bits 0x3c010204).
    #[test]
    fn rcp127_matches_reference_constant() {
        assert_eq!(RCP127.to_bits(), 1_006_699_012);
    }

    #[test]
    fn q8_0_activation_rounds_half_to_even() {
        // amax 127 → d = 1: 2.5 → 2, 3.5 → 4, −2.5 → −2.
        let mut x = vec![0.0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = 3.5;
        x[3] = -2.5;
        let mut q = Q8_0Act::with_len(32);
        quantize_q8_0(&x, &mut q);
        assert_eq!(&q.qs[..4], &[127, 2, 4, -2]);
    }
}
