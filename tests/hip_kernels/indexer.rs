//! The indexer's kernels (kernels/indexer.hip) against the CPU reference: the scores over the
//! compressed rows and the top-k selection, bitwise.

use ds4_chat::backend::cpu::indexer::top_k_mask;
use ds4_chat::backend::cpu::quant::dot_f32;
use ds4_chat::backend::hip::kernels::{self, DevPtr, Launch};
use ds4_chat::backend::hip::runtime::{DeviceBuffer, HipResult};

use super::support::*;

/// Every check of this file, with its shapes.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    for (n_tok, pos0, top_k) in [(1usize, 1203usize, 64usize), (5, 600, 100)] {
        let name = format!("kernel.indexer[{n_tok} tok at {pos0}, top {top_k}]");
        let r = guard(&format!("{name}.topk"), || {
            check_indexer(gpu, rng, &name, (n_tok, pos0, top_k), &mut *emit)
        });
        emit(r);
    }
}

/// The indexer's random inputs on the device: q [n_tok][n_head][head_dim], head weights
/// [n_tok][n_head], compressed rows [n_comp][head_dim] and the position word.
pub struct IndexerInputs {
    pub q: Vec<f32>,
    pub w: Vec<f32>,
    pub krows: Vec<f32>,
    /// (n_head, head_dim, n_comp, n_tok).
    pub shape: (usize, usize, usize, usize),
    pub pos: DeviceBuffer,
    /// q, w, krows.
    dev: [DeviceBuffer; 3],
}

impl IndexerInputs {
    /// With `tie`, rows 0 and 1 are equal (an exact score tie).
    pub fn new(
        gpu: &Gpu,
        rng: &mut CheckRng,
        shape: (usize, usize, usize, usize),
        pos0: usize,
        tie: bool,
    ) -> HipResult<IndexerInputs> {
        let (n_head, head_dim, n_comp, n_tok) = shape;
        let q = random_vec(rng, n_tok * n_head * head_dim, 1.0);
        let w = random_vec(rng, n_tok * n_head, 1.0);
        let mut krows = random_vec(rng, n_comp * head_dim, 1.0);
        if tie {
            let dup = krows[..head_dim].to_vec();
            krows[head_dim..2 * head_dim].copy_from_slice(&dup);
        }
        let dev = [gpu.up(&q)?, gpu.up(&w)?, gpu.up(&krows)?];
        let pos = gpu.up(&[pos0 as u32])?;
        Ok(IndexerInputs {
            q,
            w,
            krows,
            shape,
            pos,
            dev,
        })
    }

    /// The scores' scale: 1 / sqrt(head_dim · n_head).
    pub fn w_scale(&self) -> f32 {
        let (n_head, head_dim, _, _) = self.shape;
        1.0 / ((head_dim * n_head) as f32).sqrt()
    }

    /// `ds4_indexer_scores` of every row into `scores` (token rows `stride` apart).
    pub fn scores(&self, scores: DevPtr, ratio: usize, top_k: usize, stride: usize) -> Launch {
        let [q, w, krows] = self.dev.each_ref().map(|b| b.ptr().0);
        let (n_head, _, n_comp, n_tok) = self.shape;
        let [n_head, n_comp, ratio, top_k, stride, n_tok] =
            [n_head, n_comp, ratio, top_k, stride, n_tok].map(|v| v as u32);
        let (pos, w_scale) = (self.pos.ptr().0, self.w_scale());
        kernels::indexer_scores(
            scores, q, w, krows, pos, n_head, n_comp, ratio, top_k, stride, w_scale, n_comp, n_tok,
        )
    }
}

/// Lightning indexer: scores Σ_h max(0, k·q_h)·w_h·scale over the visible compressed rows
/// (against the CPU formula with `dot_f32`), then the top-k selection of the GPU's own scores
/// against `top_k_mask` (ties to the lower row), exact.
fn check_indexer(gpu: &Gpu, rng: &mut CheckRng, name: &str, shape: (usize, usize, usize), emit: Emit) -> Checked {
    let (n_tok, pos0, top_k) = shape;
    let (n_head, head_dim, ratio) = (64usize, 128usize, 4usize);
    let n_comp_avail = (pos0 + n_tok) / ratio;
    let score_stride = n_comp_avail + 3;
    // Two identical rows give an exact score tie for the selection's tie rule.
    let inp = IndexerInputs::new(gpu, rng, (n_head, head_dim, n_comp_avail, n_tok), pos0, true)?;
    let (qi, w, krows, w_scale) = (&inp.q, &inp.w, &inp.krows, inp.w_scale());
    let scores = gpu.poisoned::<f32>(n_tok * score_stride)?;
    let sel = gpu.poisoned::<u32>(n_tok * top_k)?;
    gpu.run(&inp.scores(scores.ptr().0, ratio, top_k, score_stride))?;
    let topk = kernels::IndexerTopk {
        sel: sel.ptr().0,
        scores: scores.ptr().0,
        pos: inp.pos.ptr().0,
        score_stride: score_stride as u32,
        n_comp_avail: n_comp_avail as u32,
        ratio: ratio as u32,
        top_k: top_k as u32,
    };
    gpu.run(&kernels::indexer_topk(&topk, n_tok as u32))?;
    let (got_scores_all, got_sel) = (scores.to_vec::<f32>()?, sel.to_vec::<u32>()?);
    let (mut got_s, mut want_s) = (Vec::new(), Vec::new());
    let mut sel_mismatch = Vec::new();
    for t in 0..n_tok {
        let n_c = ((pos0 + t + 1) / ratio).min(n_comp_avail);
        // Tokens that see at most top_k rows use no selection: the kernels skip them.
        if n_c <= top_k {
            continue;
        }
        let row_scores = &got_scores_all[t * score_stride..t * score_stride + n_c];
        got_s.extend_from_slice(row_scores);
        for c in 0..n_c {
            let k = &krows[c * head_dim..(c + 1) * head_dim];
            let mut acc = 0f32;
            for h in 0..n_head {
                let q = &qi[(t * n_head + h) * head_dim..(t * n_head + h + 1) * head_dim];
                acc += dot_f32(k, q).max(0.0) * (w[t * n_head + h] * w_scale);
            }
            want_s.push(acc);
        }
        if n_c > top_k {
            let mut allowed = vec![false; n_c];
            top_k_mask(row_scores, top_k, &mut allowed);
            let want_sel: Vec<u32> = (0..n_c as u32).filter(|&c| allowed[c as usize]).collect();
            if got_sel[t * top_k..(t + 1) * top_k] != want_sel[..] {
                sel_mismatch.push(t);
            }
        }
    }
    emit(same_bits(
        &format!("{name}.scores"),
        &got_s,
        &want_s,
        format!("{n_tok} tok, {n_head} heads, {n_comp_avail} rows"),
    ));
    let note = if sel_mismatch.is_empty() {
        format!("selection of the GPU scores equals top_k_mask for all {n_tok} tokens")
    } else {
        format!("selection differs for tokens {sel_mismatch:?}")
    };
    Ok(CheckResult::measured(
        &format!("{name}.topk"),
        sel_mismatch.len() as f64,
        0.0,
        0.0,
        sel_mismatch.is_empty(),
        note,
    ))
}
