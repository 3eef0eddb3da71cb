//! Valid random blocks of every weight type, with scales calibrated so the dequantized values have a
//! chosen standard deviation (the scheme of the reference vectors' gen_tiny_gguf.py; layouts in
//! docs/gguf.md#block-formats).
//!
//! Every function writes one block from words of a counter-based `Stream` starting at a block-specific
//! word index, so blocks are independent of each other and of threading. Scales are always finite f16.

use std::sync::OnceLock;

use crate::gguf::GgmlType;
use crate::gguf::dequant::dequantize;
use crate::gguf::half::{f16_to_f32, f32_to_f16};

use super::rng::Stream;

/// Stream words one block of `ty` consumes (block `b` uses words `b·W .. b·W + W`).
pub fn words_per_block(ty: GgmlType) -> u64 {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 | GgmlType::I32 => 1,
        GgmlType::Q8_0 => 32,
        GgmlType::Iq2Xxs => 9,
        GgmlType::Q2K => 13,
        GgmlType::Q4K => 18,
        GgmlType::Q8K => 37,
    }
}

fn put_f16(out: &mut [u8], at: usize, v: f32) {
    // Clamp into the finite f16 range so a scale can never become inf.
    let h = f32_to_f16(v.clamp(-65504.0, 65504.0));
    out[at..at + 2].copy_from_slice(&h.to_le_bytes());
}

/// Multiplicative jitter in [0.75, 1.25) so block scales are not all equal.
fn jitter(s: &Stream, j: u64) -> f32 {
    0.75 + 0.5 * s.uniform(j) as f32
}

/// Q8_0: 32 normals × `std`, quantized per block like GGML (f16 d = amax/127, round to nearest).
pub fn q8_0(s: &Stream, w0: u64, std: f32, out: &mut [u8]) {
    q8_0_with(s, w0, &[std; 32], out)
}

/// Q8_0 with a separate std per element (column gains inside one block).
pub fn q8_0_with(s: &Stream, w0: u64, std: &[f32; 32], out: &mut [u8]) {
    let mut x = [0f32; 32];
    let mut amax = 0f32;
    for (i, v) in x.iter_mut().enumerate() {
        *v = s.normal(w0 + i as u64) * std[i];
        amax = amax.max(v.abs());
    }
    put_f16(out, 0, amax / 127.0);
    let d = f16_to_f32(u16::from_le_bytes([out[0], out[1]]));
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (i, v) in x.iter().enumerate() {
        out[2 + i] = ((v * inv).round().clamp(-127.0, 127.0) as i8) as u8;
    }
}

fn fill_words(s: &Stream, w0: u64, out: &mut [u8]) {
    for (i, c) in out.chunks_mut(8).enumerate() {
        let w = s.word(w0 + i as u64).to_le_bytes();
        c.copy_from_slice(&w[..c.len()]);
    }
}

/// IQ2_XXS body with d = 1 (every bit pattern of the 64 body bytes is a valid block).
fn iq2_xxs_body(s: &Stream, w0: u64, out: &mut [u8]) {
    put_f16(out, 0, 1.0);
    fill_words(s, w0, &mut out[2..66]);
}

/// IQ2_XXS with dequantized std ≈ `std` (d = std / calibrated std at d = 1, jittered).
pub fn iq2_xxs(s: &Stream, w0: u64, std: f32, out: &mut [u8]) {
    iq2_xxs_body(s, w0, out);
    put_f16(out, 0, std / calibration().iq2_xxs * jitter(s, w0 + 8));
}

/// Q2_K body with d = 1, dmin = 1.5: 4-bit scales 1..15, mins within ±1 of the scale (keeps each
/// sub-block's mean near zero), random 2-bit codes.
fn q2_k_body(s: &Stream, w0: u64, out: &mut [u8]) {
    let a = [s.word(w0), s.word(w0 + 1)];
    let b = [s.word(w0 + 2), s.word(w0 + 3)];
    for i in 0..16 {
        let ra = (a[i / 8] >> (8 * (i % 8))) & 0xff;
        let rb = (b[i / 8] >> (8 * (i % 8))) & 0xff;
        let sc = 1 + (ra % 15) as i32;
        let mn = (sc + (rb % 3) as i32 - 1).clamp(0, 15);
        out[i] = (sc | (mn << 4)) as u8;
    }
    fill_words(s, w0 + 4, &mut out[16..80]);
    put_f16(out, 80, 1.0);
    put_f16(out, 82, 1.5);
}

pub fn q2_k(s: &Stream, w0: u64, std: f32, out: &mut [u8]) {
    q2_k_body(s, w0, out);
    let d = std / calibration().q2_k * jitter(s, w0 + 12);
    put_f16(out, 80, d);
    put_f16(out, 82, 1.5 * d);
}

/// Pack eight 6-bit (scale, min) pairs into Q4_K's 12 scale bytes (inverse of `q4_k_scale_min`).
pub fn pack_q4_k_scales(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut p = [0u8; 12];
    for j in 0..4 {
        p[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        p[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        p[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4);
    }
    p
}

/// Q4_K body with d = 1, dmin = 7.5: sub-block scales 16..63 with min = scale, so every sub-block's
/// mean (d·sc·7.5 − dmin·m) is zero; random 4-bit codes.
fn q4_k_body(s: &Stream, w0: u64, out: &mut [u8]) {
    let r = s.word(w0);
    let mut sc = [0u8; 8];
    for (j, v) in sc.iter_mut().enumerate() {
        *v = 16 + ((r >> (8 * j)) & 0xff) as u8 % 48;
    }
    put_f16(out, 0, 1.0);
    put_f16(out, 2, 7.5);
    out[4..16].copy_from_slice(&pack_q4_k_scales(&sc, &sc));
    fill_words(s, w0 + 1, &mut out[16..144]);
}

pub fn q4_k(s: &Stream, w0: u64, std: f32, out: &mut [u8]) {
    q4_k_body(s, w0, out);
    let d = std / calibration().q4_k * jitter(s, w0 + 17);
    put_f16(out, 0, d);
    put_f16(out, 2, 7.5 * d);
}

/// Dequantized std of each body at unit scale, measured once on 64 blocks with the reference
/// dequantizer (so the calibration follows the format definition, not a formula that could drift).
pub struct Calibration {
    pub iq2_xxs: f32,
    pub q2_k: f32,
    pub q4_k: f32,
}

pub fn calibration() -> &'static Calibration {
    static CAL: OnceLock<Calibration> = OnceLock::new();
    CAL.get_or_init(|| {
        let s = Stream::new(0x5eed, "calibration");
        let measure = |ty: GgmlType, body: fn(&Stream, u64, &mut [u8])| -> f32 {
            let (bb, nb) = (ty.block_bytes() as usize, 64usize);
            let mut raw = vec![0u8; bb * nb];
            for (b, blk) in raw.chunks_mut(bb).enumerate() {
                body(&s, b as u64 * 64, blk);
            }
            let v = dequantize(ty, &raw, nb * 256).expect("calibration blocks are valid");
            let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
            let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
            var.sqrt() as f32
        };
        Calibration {
            iq2_xxs: measure(GgmlType::Iq2Xxs, iq2_xxs_body),
            q2_k: measure(GgmlType::Q2K, q2_k_body),
            q4_k: measure(GgmlType::Q4K, q4_k_body),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::dequant::q4_k_scale_min;

    fn std_of(ty: GgmlType, f: fn(&Stream, u64, f32, &mut [u8]), target: f32) -> (f64, f64) {
        let s = Stream::new(3, "t");
        let (bb, nb) = (ty.block_bytes() as usize, 256usize);
        let mut raw = vec![0u8; bb * nb];
        for (b, blk) in raw.chunks_mut(bb).enumerate() {
            f(&s, b as u64 * words_per_block(ty), target, blk);
        }
        let v = dequantize(ty, &raw, nb * ty.block_elems() as usize).unwrap();
        assert!(v.iter().all(|x| x.is_finite()));
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
        (mean, var.sqrt())
    }

    #[test]
    fn dequantized_std_matches_target() {
        // 256 blocks; per-block jitter in [0.75, 1.25) has RMS ≈ 1.0104, so the pooled std sits
        // within a few percent of the target. Tolerance 8% covers jitter and sampling noise.
        for target in [0.0625f32, 0.003] {
            for (ty, f) in [
                (GgmlType::Q8_0, q8_0 as fn(&Stream, u64, f32, &mut [u8])),
                (GgmlType::Iq2Xxs, iq2_xxs),
                (GgmlType::Q2K, q2_k),
                (GgmlType::Q4K, q4_k),
            ] {
                let (mean, sd) = std_of(ty, f, target);
                assert!((sd / target as f64 - 1.0).abs() < 0.08, "{ty} std {sd} vs {target}");
                assert!(mean.abs() < 0.1 * target as f64, "{ty} mean {mean}");
            }
        }
    }

    #[test]
    fn q4_k_scale_packing_round_trips() {
        let sc = [0, 63, 17, 32, 48, 5, 63, 1];
        let m = [63, 0, 40, 7, 1, 62, 33, 16];
        let p = pack_q4_k_scales(&sc, &m);
        for j in 0..8 {
            assert_eq!(q4_k_scale_min(&p, j), (sc[j], m[j]), "sub-block {j}");
        }
    }
}
