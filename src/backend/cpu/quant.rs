//! Activation quantization (Q8_0, Q8_K) and the row dot products of the CPU reference (spec §2.2–§2.4).
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

/// Round half to even, as C's `lrintf` in the default rounding mode.
#[inline]
fn lrint(x: f32) -> i32 {
    x.round_ties_even() as i32
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

/// Q8_0 activation quantization (spec §2.2): d = amax/127, q = clamp(rint(x/d)). A trailing partial
/// block is zero padded. `out` must have been made with `Q8_0Act::with_len(x.len())` or larger.
pub fn quantize_q8_0(x: &[f32], out: &mut Q8_0Act) {
    let nb = x.len().div_ceil(QK8_0);
    for b in 0..nb {
        let lo = b * QK8_0;
        let hi = (lo + QK8_0).min(x.len());
        let blk = &x[lo..hi];
        let amax = blk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.scales[b] = d;
        let q = &mut out.qs[lo..lo + QK8_0];
        for (i, qv) in q.iter_mut().enumerate() {
            let v = if i < blk.len() { blk[i] } else { 0.0 };
            *qv = lrint(v * id).clamp(-128, 127) as i8;
        }
    }
}

/// One Q8_K activation block (spec §2.1): signed scale, 256 codes, sums of each 16 codes.
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

/// Q8_K activation quantization (spec §2.2): the largest-magnitude element (first on ties) maps to −127.
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
        y.d = 1.0 / iscale;
    }
}

#[inline]
fn isum_u8_i8(w: &[u8], x: &[i8]) -> i32 {
    // The weight codes are int8 stored as raw bytes.
    w.iter().zip(x).map(|(&a, &b)| a as i8 as i32 * b as i32).sum()
}

/// Q8_0 weight row · Q8_0 activation (spec §2.3): int32 block sums, float outer accumulation.
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

/// F16 weight row · f32 activation (spec §2.3): plain float accumulation (8 lanes, fast-math order).
pub fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    let t = f16_table();
    let mut lanes = [0.0f32; 8];
    let n = x.len();
    let full = n / 8 * 8;
    for i in (0..full).step_by(8) {
        for k in 0..8 {
            lanes[k] += le_f16(t, row, 2 * (i + k)) * x[i + k];
        }
    }
    let mut acc = lanes.iter().sum::<f32>();
    for i in full..n {
        acc += le_f16(t, row, 2 * i) * x[i];
    }
    acc
}

/// f32 dot product with 8 lanes (attention scores, indexer scores).
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let n = a.len().min(b.len());
    let full = n / 8 * 8;
    for i in (0..full).step_by(8) {
        for k in 0..8 {
            lanes[k] += a[i + k] * b[i + k];
        }
    }
    let mut acc = lanes.iter().sum::<f32>();
    for i in full..n {
        acc += a[i] * b[i];
    }
    acc
}

/// The IQ2_XXS grid expanded to signed-less byte values, one row of 8 per grid index.
fn iq2_grid_bytes() -> &'static [[i8; 8]; 256] {
    static G: OnceLock<[[i8; 8]; 256]> = OnceLock::new();
    G.get_or_init(|| {
        let mut g = [[0i8; 8]; 256];
        for (i, row) in g.iter_mut().enumerate() {
            let v = IQ2XXS_GRID[i].to_le_bytes();
            for j in 0..8 {
                row[j] = v[j] as i8;
            }
        }
        g
    })
}

/// IQ2_XXS weight row · Q8_K activation (spec §2.3): Σ (2·ls+1)·Σ(±grid·q8) per 32, × d·y.d, × 1/8.
pub fn dot_iq2_xxs(row: &[u8], x: &[BlockQ8K]) -> f32 {
    let t = f16_table();
    let grid = iq2_grid_bytes();
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
                let signs = ksigns_iq2xs(((a1 >> (7 * k)) & 127) as u8);
                for j in 0..8 {
                    let v = g[j] as i32 * q8[8 * k + j] as i32;
                    sumi += if signs & (1 << j) != 0 { -v } else { v };
                }
            }
            bsum += sumi * (2 * ls + 1);
        }
        acc += d * bsum as f32;
    }
    acc * 0.125
}

/// Q2_K weight row · Q8_K activation (spec §2.3).
pub fn dot_q2_k(row: &[u8], x: &[BlockQ8K]) -> f32 {
    let t = f16_table();
    let mut acc = 0.0f32;
    for (blk, y) in row.chunks_exact(84).zip(x) {
        let scales = &blk[0..16];
        let qs = &blk[16..80];
        let d = le_f16(t, blk, 80);
        let dmin = le_f16(t, blk, 82);
        let mut summs = 0i32;
        for s in 0..16 {
            summs += y.bsums[s] as i32 * (scales[s] >> 4) as i32;
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
        acc += y.d * d * isum as f32 - y.d * dmin * summs as f32;
    }
    acc
}

/// 6-bit scale and min of Q4_K sub-block `j` (spec §2.1).
#[inline]
pub fn q4_k_scale_min(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// Q4_K weight row · Q8_K activation (spec §2.3, the CUDA formula; ds4's CPU path has none).
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
