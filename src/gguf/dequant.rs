//! Reference dequantization of GGUF tensor bytes to f32 (docs/gguf.md#block-formats).
//!
//! Owns the decoding of one block of every weight type ds4 files use: F32, F16, BF16, Q8_0, Q2_K,
//! Q4_K and IQ2_XXS. It is the readable statement of each format, proven bit for bit against the PyPI
//! `gguf` package's dequantizer by tests/dequant_fixtures.rs; backends may use it for reference paths
//! and tests but implement their own fused dot products. I32 (token → expert tables) and Q8_K
//! (activations only) are not float weight types and are rejected.
//!
//! The float operations are written in the same order as the oracle (each product rounded to f32, no
//! fused multiply-add) so results are bit-identical, not merely close.

use super::error::GgufError;
use super::half::{bf16_to_f32, f16_to_f32};
use super::iq2_tables::{IQ2XXS_GRID, ksigns_iq2xs};
use super::reader::{GgufFile, TensorInfo};
use super::types::GgmlType;

/// Elements per K-quant / IQ2 super-block.
pub const QK_K: usize = 256;
/// Elements per Q8_0 block.
pub const QK8_0: usize = 32;

#[inline]
fn le_f16(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

#[inline]
fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Q8_0 block (34 bytes → 32 values): f16 `d`, then 32 int8 codes; value = code · d.
pub fn block_q8_0(b: &[u8], out: &mut [f32]) {
    let d = le_f16(b, 0);
    for (o, &q) in out[..QK8_0].iter_mut().zip(&b[2..2 + QK8_0]) {
        *o = (q as i8) as f32 * d;
    }
}

/// Q2_K block (84 bytes → 256 values). Layout: scales[16] at 0, qs[64] at 16, f16 d at 80, f16 dmin
/// at 82. Element 128k + 32j + l takes bits 2j..2j+2 of qs[32k + l] and the scale byte of sub-block
/// 8k + 2j + (l ≥ 16): value = (d · low nibble) · q − dmin · high nibble.
pub fn block_q2_k(b: &[u8], out: &mut [f32]) {
    let d = le_f16(b, 80);
    let dmin = le_f16(b, 82);
    let (scales, qs) = (&b[0..16], &b[16..80]);
    for k in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                let s = scales[8 * k + 2 * j + l / 16];
                let dl = d * (s & 15) as f32;
                let ml = dmin * (s >> 4) as f32;
                let q = (qs[32 * k + l] >> (2 * j)) & 3;
                out[128 * k + 32 * j + l] = dl * q as f32 - ml;
            }
        }
    }
}

/// 6-bit scale and min of Q4_K sub-block `j` (0..8) from the 12 packed scale bytes.
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

/// Q4_K block (144 bytes → 256 values): f16 d at 0, f16 dmin at 2, 12 scale bytes at 4, qs[128] at
/// 16. Element 64c + 32h + l uses sub-block j = 2c + h and nibble h of qs[32c + l]:
/// value = (d · sc_j) · q − dmin · m_j.
pub fn block_q4_k(b: &[u8], out: &mut [f32]) {
    let d = le_f16(b, 0);
    let dmin = le_f16(b, 2);
    let (scales, qs) = (&b[4..16], &b[16..144]);
    for c in 0..4 {
        for h in 0..2 {
            let (sc, m) = q4_k_scale_min(scales, 2 * c + h);
            let dl = d * sc as f32;
            let ml = dmin * m as f32;
            for l in 0..32 {
                let q = (qs[32 * c + l] >> (4 * h)) & 15;
                out[64 * c + 32 * h + l] = dl * q as f32 - ml;
            }
        }
    }
}

/// IQ2_XXS block (66 bytes → 256 values): f16 d, then 8 sub-blocks of two u32. The first word holds
/// four grid indices (one per 8 values), the second four 7-bit sign indices and a 4-bit scale `ls` in
/// its top bits: value = (d · (0.5 + ls) · 0.25) · grid byte, negated where the sign pattern says so.
pub fn block_iq2_xxs(b: &[u8], out: &mut [f32]) {
    let d = le_f16(b, 0);
    for ib in 0..8 {
        let a0 = le_u32(b, 2 + 8 * ib);
        let a1 = le_u32(b, 2 + 8 * ib + 4);
        let db = d * (0.5 + (a1 >> 28) as f32) * 0.25;
        for k in 0..4 {
            let grid = IQ2XXS_GRID[((a0 >> (8 * k)) & 0xff) as usize].to_le_bytes();
            let signs = ksigns_iq2xs(((a1 >> (7 * k)) & 0x7f) as u8);
            for j in 0..8 {
                let sign = if signs & (1 << j) != 0 { -1.0f32 } else { 1.0 };
                out[32 * ib + 8 * k + j] = db * grid[j] as f32 * sign;
            }
        }
    }
}

/// Whether `ty` is a float weight type this module decodes.
pub fn is_dequantizable(ty: GgmlType) -> bool {
    !matches!(ty, GgmlType::I32 | GgmlType::Q8K)
}

/// Decode `out.len()` elements of type `ty` from the front of `data`.
///
/// Errors (one line): an integer or activation-only type, an element count that is not whole blocks,
/// or `data` shorter than the elements need.
pub fn dequantize_into(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), GgufError> {
    if !is_dequantizable(ty) {
        return Err(GgufError::msg(format!(
            "cannot dequantize {ty}: not a float weight type (expected F32, F16, BF16, Q8_0, Q2_K, Q4_K or IQ2_XXS)"
        )));
    }
    let n = out.len() as u64;
    let be = ty.block_elems();
    if !n.is_multiple_of(be) {
        return Err(GgufError::msg(format!(
            "cannot dequantize {n} {ty} elements: not a whole number of {be}-element blocks"
        )));
    }
    let need = ty.bytes_for(n).unwrap_or(u64::MAX);
    if (data.len() as u64) < need {
        return Err(GgufError::msg(format!(
            "cannot dequantize {n} {ty} elements: need {need} bytes, have {}",
            data.len()
        )));
    }
    let bb = ty.block_bytes() as usize;
    let be = be as usize;
    let block_fn: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
            return Ok(());
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
            return Ok(());
        }
        GgmlType::Bf16 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
            return Ok(());
        }
        GgmlType::Q8_0 => block_q8_0,
        GgmlType::Q2K => block_q2_k,
        GgmlType::Q4K => block_q4_k,
        GgmlType::Iq2Xxs => block_iq2_xxs,
        GgmlType::I32 | GgmlType::Q8K => unreachable!("rejected above"),
    };
    for (o, blk) in out.chunks_exact_mut(be).zip(data.chunks_exact(bb)) {
        block_fn(blk, o);
    }
    Ok(())
}

/// Decode `n` elements of type `ty` into a new vector.
pub fn dequantize(ty: GgmlType, data: &[u8], n: usize) -> Result<Vec<f32>, GgufError> {
    let mut out = vec![0.0f32; n];
    dequantize_into(ty, data, &mut out)?;
    Ok(out)
}

/// Decode a whole tensor of a parsed file (errors name the tensor).
pub fn dequantize_tensor(file: &GgufFile, t: &TensorInfo) -> Result<Vec<f32>, GgufError> {
    dequantize(t.ty, file.tensor_data(t), t.n_elements() as usize)
        .map_err(|e| GgufError::at(t.offset, format!("tensor '{}': {}", t.name, e.message)))
}

/// Decode row `row` of a 2-D (or expert-sliced) tensor whose rows are `n_in` elements long.
pub fn dequantize_row(ty: GgmlType, data: &[u8], n_in: usize, row: usize) -> Result<Vec<f32>, GgufError> {
    let rb = ty.bytes_for(n_in as u64).unwrap_or(u64::MAX) as usize;
    let start = row.saturating_mul(rb);
    let Some(bytes) = data.get(start..start.saturating_add(rb)) else {
        return Err(GgufError::msg(format!(
            "row {row} of {n_in} {ty} elements lies past the {} bytes given",
            data.len()
        )));
    };
    dequantize(ty, bytes, n_in)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::half::f32_to_f16;

    #[test]
    fn q8_0_hand_block() {
        let mut b = vec![0u8; 34];
        b[0..2].copy_from_slice(&f32_to_f16(0.5).to_le_bytes());
        b[2] = 3;
        b[3] = (-4i8) as u8;
        b[33] = 127;
        let v = dequantize(GgmlType::Q8_0, &b, 32).unwrap();
        assert_eq!((v[0], v[1], v[2], v[31]), (1.5, -2.0, 0.0, 63.5));
    }

    #[test]
    fn q2_k_hand_block() {
        // One nonzero code per (k, j): element 128k + 32j + l=17 uses sub-block 8k + 2j + 1.
        let mut b = vec![0u8; 84];
        b[80..82].copy_from_slice(&f32_to_f16(2.0).to_le_bytes());
        b[82..84].copy_from_slice(&f32_to_f16(0.25).to_le_bytes());
        b[8 + 2 + 1] = 0x35; // sub-block 11 (k=1, j=1, upper half): scale 5, min 3
        b[16 + 32 + 17] = 0b0000_1000; // qs[32·1 + 17], bits 2..4 = code 2 for j = 1
        let v = dequantize(GgmlType::Q2K, &b, 256).unwrap();
        assert_eq!(v[128 + 32 + 17], 2.0 * 5.0 * 2.0 - 0.25 * 3.0);
        assert_eq!(v[128 + 32 + 16], -0.75); // same sub-block, code 0
        assert_eq!(v[0], 0.0);
    }

    #[test]
    fn q4_k_scale_packing() {
        // Sub-block 5: sc = (scales[9] & 15) | (scales[1] >> 6) << 4, m = (scales[9] >> 4) | (scales[5] >> 6) << 4.
        let mut s = [0u8; 12];
        s[9] = 0xA7;
        s[1] = 0b1100_0000;
        s[5] = 0b0100_0000;
        assert_eq!(q4_k_scale_min(&s, 5), (0x37, 0x1A));
        assert_eq!(q4_k_scale_min(&s, 1), (0, 0));
    }

    #[test]
    fn iq2_xxs_hand_block() {
        let mut b = vec![0u8; 66];
        b[0..2].copy_from_slice(&f32_to_f16(1.0).to_le_bytes());
        // Sub-block 0: grid index 1 for group 0 (…082b: element 0 = 0x2b), sign index 1 (→ 0x81:
        // elements 0 and 7 negative), ls = 3 → db = 3.5 · 0.25.
        b[2] = 1;
        b[6..10].copy_from_slice(&(1u32 | (3 << 28)).to_le_bytes());
        let v = dequantize(GgmlType::Iq2Xxs, &b, 256).unwrap();
        assert_eq!(v[0], -0.875 * 43.0);
        assert_eq!(v[1], 0.875 * 8.0);
        assert_eq!(v[7], -0.875 * 8.0);
    }

    #[test]
    fn rejects_integer_types_and_short_input() {
        assert!(
            dequantize(GgmlType::I32, &[0; 8], 2)
                .unwrap_err()
                .message
                .contains("I32")
        );
        assert!(dequantize(GgmlType::Q8K, &[0; 292], 256).is_err());
        let e = dequantize(GgmlType::Q2K, &[0; 83], 256).unwrap_err();
        assert!(e.message.contains("need 84 bytes, have 83"), "{e}");
        assert!(dequantize(GgmlType::Q8_0, &[0; 34], 31).is_err());
        assert!(dequantize_row(GgmlType::Q8_0, &[0; 68], 32, 2).is_err());
        assert_eq!(dequantize_row(GgmlType::Q8_0, &[0; 68], 32, 1).unwrap().len(), 32);
    }
}
