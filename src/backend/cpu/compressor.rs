//! The KV compressor of compressed layers (docs/model.md#compressor): per-token state update and, every `ratio`
//! tokens, a per-dimension softmax pooling into one compressed row, normalised, rotated at the window
//! start and passed through the layer's quantization simulation.
//!
//! Owns the compressor state (`CompressorState`) and the pooling; the projections are computed by the
//! caller (batched over a prefill chunk) and handed in per token.

use super::ops::{self, Rope};
use super::transcend;

/// The "minus infinity" sentinel of ds4 (a finite float) for empty score rows.
pub const NEG_INF: f32 = -1.0e30;

/// Rolling compressor state: `coff·ratio` rows × `coff·hd` columns of kv and score (docs/model.md#compressor).
#[derive(Clone, Debug)]
pub struct CompressorState {
    pub ratio: usize,
    pub hd: usize,
    pub coff: usize,
    pub kv: Vec<f32>,
    pub score: Vec<f32>,
}

impl CompressorState {
    pub fn new(ratio: usize, hd: usize) -> CompressorState {
        let coff = if ratio == 4 { 2 } else { 1 };
        let n = coff * ratio * coff * hd;
        CompressorState {
            ratio,
            hd,
            coff,
            kv: vec![0.0; n],
            score: vec![NEG_INF; n],
        }
    }

    pub fn width(&self) -> usize {
        self.coff * self.hd
    }

    pub fn reset(&mut self) {
        self.kv.fill(0.0);
        self.score.fill(NEG_INF);
    }

    /// Reset the rows that belong to no live window after `n` tokens (docs/model.md#compressor), so a
    /// serialized state matches ds4's regardless of how the tokens were fed.
    pub fn clear_stale(&mut self, n: usize) {
        let w = self.width();
        let first = if self.ratio == 4 { 4 + n % 4 } else { n % self.ratio };
        let rows = self.coff * self.ratio;
        self.kv[first * w..rows * w].fill(0.0);
        self.score[first * w..rows * w].fill(NEG_INF);
    }

    /// Feed token `pos`'s projections (`kv_cur`, `sc_cur` without the ape term, each `coff·hd`).
    /// Returns true when a row was pooled into `out` (hd wide, before norm/rope/quantization).
    pub fn push(&mut self, kv_cur: &[f32], sc_cur: &[f32], ape: &[f32], pos: usize, out: &mut [f32]) -> bool {
        let w = self.width();
        let r = self.ratio;
        let slot = pos % r;
        let row = if r == 4 { 4 + slot } else { slot };
        self.kv[row * w..(row + 1) * w].copy_from_slice(kv_cur);
        // ape row `slot` of the [coff·hd, ratio] tensor is added to the score (docs/model.md#compressor).
        let ape_row = &ape[slot * w..(slot + 1) * w];
        for j in 0..w {
            self.score[row * w + j] = sc_cur[j] + ape_row[j];
        }
        if !(pos + 1).is_multiple_of(r) {
            return false;
        }
        self.pool(out);
        if r == 4 {
            // The current window's rows become the previous window's.
            self.kv.copy_within(4 * w..8 * w, 0);
            self.score.copy_within(4 * w..8 * w, 0);
        }
        true
    }

    /// Per-dimension softmax pooling over the candidate rows (ratio 4: rows 0..3 first half and rows
    /// 4..7 second half; ratio 128: all rows, one half).
    fn pool(&self, out: &mut [f32]) {
        let w = self.width();
        let hd = self.hd;
        let r = self.ratio;
        let cands = |j: usize| -> [(usize, usize); 2] {
            // (row offset base, column) for the two halves; ratio-128 uses only the first.
            [(0, j), (r, hd + j)]
        };
        for (j, o) in out.iter_mut().enumerate().take(hd) {
            let halves = if r == 4 { 2 } else { 1 };
            let cs = cands(j);
            let mut m = NEG_INF;
            for i in 0..r {
                for &(rb, col) in &cs[..halves] {
                    m = m.max(self.score[(rb + i) * w + col]);
                }
            }
            if m <= NEG_INF * 0.5 {
                *o = 0.0;
                continue;
            }
            // Summation order as the reference: per window slot, both candidates' weights together.
            let mut den = 0.0f32;
            let mut sum = 0.0f32;
            for i in 0..r {
                let (rb, col) = cs[0];
                let wp = transcend::exp(self.score[(rb + i) * w + col] - m);
                if halves == 2 {
                    let (rc, colc) = cs[1];
                    let wc = transcend::exp(self.score[(rc + i) * w + colc] - m);
                    den += wp + wc;
                    sum += wp * self.kv[(rb + i) * w + col];
                    sum += wc * self.kv[(rc + i) * w + colc];
                } else {
                    den += wp;
                    sum += wp * self.kv[(rb + i) * w + col];
                }
            }
            *o = if den > 0.0 { sum / den } else { 0.0 };
        }
    }
}

/// Which simulation a finished row goes through (docs/model.md#compressor).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RowKind {
    /// Attention row: E4M3 on the first `n_nope` dims.
    Attention { n_nope: usize },
    /// Indexer row: Hadamard + FP4 on the whole row.
    Indexer,
}

/// Normalise, rotate at the window start `pos + 1 − ratio` and quantize a pooled row in place.
pub fn finish_row(row: &mut [f32], norm: &[f32], eps: f32, rope: &Rope, ratio: usize, pos: usize, kind: RowKind) {
    ops::rms_norm_inplace(row, Some(norm), eps);
    let hd = row.len();
    rope.apply(row, hd, pos + 1 - ratio, false);
    match kind {
        RowKind::Attention { n_nope } => ops::fp8_kv_round_trip(row, n_nope),
        RowKind::Indexer => ops::indexer_qat(row),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ratio 4 with constant scores: the pooled value is the plain mean over the 8 candidates (the
    /// previous window's first half and the current window's second half).
    #[test]
    fn ratio4_pools_previous_first_half_and_current_second_half() {
        let hd = 2;
        let mut st = CompressorState::new(4, hd);
        let ape = vec![0.0f32; 4 * 4];
        let mut out = [0.0f32; 2];
        // Window 0 (pos 0..3): kv = [a, a, b, b] with first half a = pos, second half b = 100 + pos.
        for pos in 0..4 {
            let p = pos as f32;
            let emitted = st.push(&[p, p, 100.0 + p, 100.0 + p], &[0.0; 4], &ape, pos, &mut out);
            assert_eq!(emitted, pos == 3);
        }
        // First window: previous rows are empty (score −1e30 → weight 0): mean of 100..103.
        assert!((out[0] - 101.5).abs() < 1e-4, "{out:?}");
        for pos in 4..8 {
            let p = pos as f32;
            st.push(&[p, p, 100.0 + p, 100.0 + p], &[0.0; 4], &ape, pos, &mut out);
        }
        // Second window: first halves of window 0 (0..3) and second halves of window 1 (104..107).
        let want = (0.0 + 1.0 + 2.0 + 3.0 + 104.0 + 105.0 + 106.0 + 107.0) / 8.0;
        assert!((out[0] - want).abs() < 1e-4, "{out:?} vs {want}");
    }
}
