//! The fast indexer (kernels/indexer_fast.hip) against the exact kernels of kernels/indexer.hip
//! on the same random inputs: the scores (a sum over heads of dots, reordered: FAST_TOL x
//! max|exact|), and the segmented top-k against `ds4_indexer_topk`: a selection without arithmetic,
//! so the lists must be equal, ties (to the lower row) included.

use ds4_chat::backend::hip::kernels;
use ds4_chat::backend::hip::runtime::{DeviceBuffer, HipResult};

use super::indexer::IndexerInputs;
use super::support::*;

/// Every check of this file.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    let scores_name =
        |(n_head, n_comp, n_tok)| format!("indexer_fast.scores[{n_head} heads, {n_comp} rows, {n_tok} tok]");
    let scores_cases = [(64usize, 1000usize, 2usize), (4, 300, 1), (64, 17_500, 1), (64, 700, 6)];
    each(gpu, rng, emit, scores_cases, scores_name, check_indexer_scores);
    // (rows, top_k, segment, distinct score levels: few levels make many ties).
    let topk_cases = [
        (600usize, 512u32, 4096u32, 0u32),
        (1000, 64, 128, 7),
        (17_500, 512, 4096, 0),
        (17_500, 512, 4096, 40),
        (262_144, 512, 4096, 0),
    ];
    let topk_name =
        |(n, top_k, seg, levels)| format!("indexer_fast.topk[{n} rows, top {top_k}, seg {seg}, levels {levels}]");
    each(gpu, rng, emit, topk_cases, topk_name, check_topk);
}

/// `ds4_indexer_scores_decode_fast` (32 rows a block, each dot four partial sums) and
/// `ds4_indexer_scores_fast` (128 rows a block, one chain a dot) against `ds4_indexer_scores` (a
/// sum over 64 heads of 128-long dots, reordered: FAST_TOL). Tokens at the last positions that see
/// all `n_comp` rows.
fn check_indexer_scores(gpu: &Gpu, rng: &mut CheckRng, name: &str, shape: (usize, usize, usize)) -> Checked {
    let (n_head, n_comp, n_tok) = shape;
    let (dim, ratio, top_k) = (128usize, 4usize, 16usize);
    let stride = n_comp + 3;
    let inp = IndexerInputs::new(gpu, rng, (n_head, dim, n_comp, n_tok), n_comp * ratio, false)?;
    let exact_launch = |out: u64| inp.scores(out, ratio, top_k, stride);
    let [want_d, rows32_d, rows128_d] = [(); 3].map(|_| gpu.poisoned::<f32>(n_tok * stride));
    let (want_d, rows32_d, rows128_d) = (want_d?, rows32_d?, rows128_d?);
    gpu.run(&exact_launch(want_d.ptr().0))?;
    let grids = |tokens| kernels::FastGrids {
        indexer_decode_tokens: tokens,
        ..kernels::FastGrids::default()
    };
    let rows32 = kernels::fast_twin_tuned(&exact_launch(rows32_d.ptr().0), grids(u32::MAX)).expect("a fast twin");
    let rows128 = kernels::fast_twin_tuned(&exact_launch(rows128_d.ptr().0), grids(0)).expect("a fast twin");
    assert_eq!(
        (rows32.kernel.name, rows128.kernel.name),
        ("ds4_indexer_scores_decode_fast", "ds4_indexer_scores_fast")
    );
    gpu.run(&rows32)?;
    gpu.run(&rows128)?;
    // Only the scores of the rows (the stride's spare entries stay poisoned in all three).
    let rows = |d: &DeviceBuffer| -> HipResult<Vec<f32>> {
        Ok(d.to_vec::<f32>()?
            .chunks(stride)
            .flat_map(|r| r[..n_comp].to_vec())
            .collect())
    };
    let (want, got32, got128) = (rows(&want_d)?, rows(&rows32_d)?, rows(&rows128_d)?);
    let note = format!("{n_tok} tok, {n_head} heads x {n_comp} rows");
    let r128 = close_scaled(name, &got128, &want, FAST_TOL, note.clone());
    let mut r = close_scaled(name, &got32, &want, FAST_TOL, format!("32-row blocks: {note}"));
    if r128.verdict != Verdict::Pass {
        r.verdict = Verdict::Fail;
    }
    r.note = format!(
        "{}; 128-row blocks: max_abs {:.3e} ({:?})",
        r.note, r128.max_abs, r128.verdict
    );
    Ok(r)
}

/// The segmented top-k against `ds4_indexer_topk` for two tokens at the position where the first
/// sees `n` - 1 rows and the second `n` (ratio 4).
fn check_topk(gpu: &Gpu, rng: &mut CheckRng, name: &str, shape: (usize, u32, u32, u32)) -> Checked {
    let (n, top_k, seg, levels) = shape;
    let (ratio, n_tok) = (4u32, 2usize);
    let stride = n + 5;
    let scores: Vec<f32> = (0..n_tok * stride)
        .map(|_| match levels {
            0 => rng.next_f32(),
            l => rng.int_in(0, l as i64 - 1) as f32 * 0.25,
        })
        .collect();
    let pos0 = n as u32 * ratio - 2;
    let pos_d = gpu.up(&[pos0])?;
    let sc_exact = gpu.up(&scores)?;
    let sc_fast = gpu.up(&scores)?;
    let sel_exact = gpu.poisoned::<u32>(n_tok * top_k as usize)?;
    let sel_fast = gpu.poisoned::<u32>(n_tok * top_k as usize)?;
    let (st, nc) = (stride as u32, n as u32);
    let exact = kernels::IndexerTopk {
        sel: sel_exact.ptr().0,
        scores: sc_exact.ptr().0,
        pos: pos_d.ptr().0,
        score_stride: st,
        n_comp_avail: nc,
        ratio,
        top_k,
    };
    gpu.run(&kernels::indexer_topk(&exact, n_tok as u32))?;
    let fast = kernels::IndexerTopk {
        sel: sel_fast.ptr().0,
        scores: sc_fast.ptr().0,
        ..exact
    };
    let launches = kernels::indexer_topk_segmented(&fast, seg, nc, n_tok as u32).expect("a segment within bounds");
    for l in &launches {
        gpu.run(l)?;
    }
    let (want, got) = (sel_exact.to_vec::<u32>()?, sel_fast.to_vec::<u32>()?);
    let differ = want.iter().zip(&got).filter(|(a, b)| a != b).count();
    Ok(count_differ(
        name,
        differ,
        want.len() == got.len(),
        format!(
            "{differ} of {} list entries differ; {} segments",
            want.len(),
            (n as u32 / seg).max(1)
        ),
    ))
}
