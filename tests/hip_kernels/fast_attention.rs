//! The fast decode attention (kernels/attention_fast.hip: rows split over slices, then a merge)
//! against the exact attention kernels on the same random rows: short contexts, a full ratio-4
//! window with the indexer's selection and a wrapped ring, and the ratio-128 rows of 70k and 1M
//! tokens; each launched with the split count a captured decode graph uses (the session's most
//! rows), so most slices exit, and again with the grid a direct launch sizes to the batch's rows,
//! which must give the same bits (a replayed decode graph equals direct launches). Float outputs within FAST_TOL x max|exact|: each output is a
//! softmax-weighted mean of rows whose sums are reordered (a few ulps of the largest partial sums).
//! The segmented indexer top-k (kernels/indexer_fast.hip) against `ds4_indexer_topk`: a selection
//! without arithmetic, so the lists must be equal, ties (to the lower row) included.

use ds4_chat::backend::hip::kernels::{self, AttentionShape, AttentionSplitPlan};
use ds4_chat::backend::hip::runtime::HipResult;

use super::support::*;

const FAST_TOL: f64 = 1e-5;

/// One attention case: tokens, first position, ratio, compressed rows in the cache, top_k (0 = no
/// selection), the most rows the launch is sized for, heads.
struct Case {
    label: &'static str,
    n_tok: usize,
    pos0: usize,
    ratio: usize,
    n_comp: usize,
    top_k: usize,
    max_rows: u32,
    n_head: usize,
}

/// Every check of this file.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: &mut dyn FnMut(CheckResult)) {
    let cases = [
        Case {
            label: "17 rows dense, graph sized for 640",
            n_tok: 1,
            pos0: 16,
            ratio: 0,
            n_comp: 0,
            top_k: 0,
            max_rows: 640,
            n_head: 64,
        },
        Case {
            label: "2k ratio4 +indexer sel, 640 rows",
            n_tok: 1,
            pos0: 2100,
            ratio: 4,
            n_comp: 525,
            top_k: 512,
            max_rows: 640,
            n_head: 64,
        },
        Case {
            label: "3 tok ratio4 no sel",
            n_tok: 3,
            pos0: 37,
            ratio: 4,
            n_comp: 9,
            top_k: 0,
            max_rows: 140,
            n_head: 16,
        },
        Case {
            label: "70k ratio128, 674 rows",
            n_tok: 1,
            pos0: 70000,
            ratio: 128,
            n_comp: 546,
            top_k: 0,
            max_rows: 674,
            n_head: 16,
        },
        Case {
            label: "1M ratio128, 8315 rows",
            n_tok: 1,
            pos0: 1_048_000,
            ratio: 128,
            n_comp: 8187,
            top_k: 0,
            max_rows: 8320,
            n_head: 8,
        },
    ];
    for c in &cases {
        let name = format!("fast_attention.decode_split[{}]", c.label);
        emit(guard(&name, || check_split(gpu, rng, &name, c)));
    }
    for (n_head, n_comp, n_tok) in [(64usize, 1000usize, 2usize), (4, 300, 1), (64, 17_500, 1)] {
        let name = format!("fast_attention.indexer_scores[{n_head} heads, {n_comp} rows, {n_tok} tok]");
        emit(guard(&name, || {
            check_indexer_scores(gpu, rng, &name, (n_head, n_comp, n_tok))
        }));
    }
    // (rows, top_k, segment, distinct score levels: few levels make many ties).
    for (n, top_k, seg, levels) in [
        (600usize, 512u32, 4096u32, 0u32),
        (1000, 64, 128, 7),
        (17_500, 512, 4096, 0),
        (17_500, 512, 4096, 40),
        (262_144, 512, 4096, 0),
    ] {
        let name = format!("fast_attention.indexer_topk[{n} rows, top {top_k}, seg {seg}, levels {levels}]");
        emit(guard(&name, || check_topk(gpu, rng, &name, (n, top_k, seg, levels))));
    }
}

/// `ds4_indexer_scores_fast` against `ds4_indexer_scores` (a sum over 64 heads of 128-long dots,
/// reordered: FAST_TOL). Tokens at the last positions that see all `n_comp` rows.
fn check_indexer_scores(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    shape: (usize, usize, usize),
) -> HipResult<CheckResult> {
    let (n_head, n_comp, n_tok) = shape;
    let (dim, ratio, top_k) = (128usize, 4u32, 16u32);
    let qi = random_vec(rng, n_tok * n_head * dim, 1.0);
    let w = random_vec(rng, n_tok * n_head, 1.0);
    let krows = random_vec(rng, n_comp * dim, 1.0);
    let stride = n_comp + 3;
    let pos0 = (n_comp as u32) * ratio;
    let (qi_d, w_d, k_d, pos_d) = (gpu.up(&qi)?, gpu.up(&w)?, gpu.up(&krows)?, gpu.up(&[pos0])?);
    let exact_launch = |out: u64| {
        kernels::indexer_scores(
            out,
            qi_d.ptr().0,
            w_d.ptr().0,
            k_d.ptr().0,
            pos_d.ptr().0,
            n_head as u32,
            n_comp as u32,
            ratio,
            top_k,
            stride as u32,
            1.0 / ((dim * n_head) as f32).sqrt(),
            n_comp as u32,
            n_tok as u32,
        )
    };
    let (want_d, got_d) = (
        gpu.poisoned::<f32>(n_tok * stride)?,
        gpu.poisoned::<f32>(n_tok * stride)?,
    );
    gpu.run(&exact_launch(want_d.ptr().0))?;
    gpu.run(&kernels::fast_twin(&exact_launch(got_d.ptr().0)).expect("a fast twin"))?;
    // Only the scores of the rows (the stride's spare entries stay poisoned in both).
    let rows = |v: Vec<f32>| -> Vec<f32> { v.chunks(stride).flat_map(|r| r[..n_comp].to_vec()).collect() };
    let (want, got) = (rows(want_d.to_vec::<f32>()?), rows(got_d.to_vec::<f32>()?));
    Ok(close_scaled(
        name,
        &got,
        &want,
        FAST_TOL,
        format!("{n_tok} tok, {n_head} heads x {n_comp} rows"),
    ))
}

/// The segmented top-k against `ds4_indexer_topk` for two tokens at the position where the first
/// sees `n` - 1 rows and the second `n` (ratio 4).
fn check_topk(gpu: &Gpu, rng: &mut CheckRng, name: &str, shape: (usize, u32, u32, u32)) -> HipResult<CheckResult> {
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
    gpu.run(&kernels::indexer_topk(
        sel_exact.ptr().0,
        sc_exact.ptr().0,
        pos_d.ptr().0,
        st,
        nc,
        ratio,
        top_k,
        n_tok as u32,
    ))?;
    let launches = kernels::indexer_topk_segmented(
        sel_fast.ptr().0,
        sc_fast.ptr().0,
        pos_d.ptr().0,
        st,
        nc,
        ratio,
        top_k,
        seg,
        nc,
        n_tok as u32,
    )
    .expect("a segment within bounds");
    for l in &launches {
        gpu.run(l)?;
    }
    let (want, got) = (sel_exact.to_vec::<u32>()?, sel_fast.to_vec::<u32>()?);
    let differ = want.iter().zip(&got).filter(|(a, b)| a != b).count();
    Ok(CheckResult::measured(
        name,
        differ as f64,
        0.0,
        0.0,
        differ == 0 && want.len() == got.len(),
        format!(
            "{differ} of {} list entries differ; {} segments",
            want.len(),
            (n as u32 / seg).max(1)
        ),
    ))
}

fn check_split(gpu: &Gpu, rng: &mut CheckRng, name: &str, c: &Case) -> HipResult<CheckResult> {
    let (head_dim, window, ring_cap) = (512usize, 128usize, 256usize);
    let n_head = c.n_head;
    let q = random_vec(rng, c.n_tok * n_head * head_dim, 1.0);
    let ring = random_vec(rng, ring_cap * head_dim, 1.0);
    let comp = random_vec(rng, c.n_comp.max(1) * head_dim, 1.0);
    let sinks = random_vec(rng, n_head, 2.0);
    // Ascending distinct selections of top_k rows among each token's compressed rows.
    let mut sel: Vec<u32> = Vec::new();
    for t in 0..c.n_tok {
        let n_c = (c.pos0 + t + 1).checked_div(c.ratio).map_or(0, |n| n.min(c.n_comp));
        if c.top_k > 0 {
            let mut all: Vec<u32> = (0..n_c as u32).collect();
            for i in (1..all.len()).rev() {
                all.swap(i, rng.int_in(0, i as i64) as usize);
            }
            let mut rows: Vec<u32> = all.into_iter().take(c.top_k.min(n_c)).collect();
            rows.sort_unstable();
            rows.resize(c.top_k, 0);
            sel.extend(rows);
        }
    }
    let shape = AttentionShape {
        n_head: n_head as u32,
        head_dim: head_dim as u32,
        ring_cap: ring_cap as u32,
        window: window as u32,
        ratio: c.ratio as u32,
        top_k: c.top_k as u32,
    };
    let selected = c.top_k > 0;
    let rows = shape.visible_rows((c.pos0 + c.n_tok - 1) as u32, c.n_comp as u32, selected);
    assert!(rows <= c.max_rows, "{name}: {rows} rows > {}", c.max_rows);
    let (q_d, r_d, c_d, s_d) = (gpu.up(&q)?, gpu.up(&ring)?, gpu.up(&comp)?, gpu.up(&sinks)?);
    let sel_d = gpu.up(&if sel.is_empty() { vec![0u32] } else { sel })?;
    let sel_p = if selected { sel_d.ptr().0 } else { kernels::NULL };
    let pos_d = gpu.up(&[c.pos0 as u32])?;
    let nt = c.n_tok as u32;
    // Exact: scores, softmax, values.
    let out_exact = gpu.poisoned::<f32>(c.n_tok * n_head * head_dim)?;
    let sc = gpu.poisoned::<f32>(shape.score_floats(nt, c.max_rows))?;
    let inv = gpu.poisoned::<f32>(c.n_tok * n_head)?;
    for l in kernels::attention(
        &shape,
        out_exact.ptr().0,
        sc.ptr().0,
        inv.ptr().0,
        q_d.ptr().0,
        r_d.ptr().0,
        c_d.ptr().0,
        sel_p,
        s_d.ptr().0,
        pos_d.ptr().0,
        c.n_comp as u32,
        c.max_rows,
        nt,
    ) {
        gpu.run(&l)?;
    }
    // Fast: the split over the slices a graph sized for max_rows launches, and over the grid a
    // direct launch sizes to the batch's own rows: the same slices, so the same bits.
    let split = |max_rows: u32| -> HipResult<(Vec<f32>, u32)> {
        let plan = AttentionSplitPlan::new(&shape, nt, max_rows, usize::MAX / 8).expect("a split plan");
        let scratch =
            gpu.poisoned::<f32>(plan.acc_floats(&shape, nt) + 2 * c.n_tok * n_head * plan.n_split as usize)?;
        let out = gpu.poisoned::<f32>(c.n_tok * n_head * head_dim)?;
        for l in kernels::attention_decode_split(
            &shape,
            plan,
            out.ptr().0,
            scratch.ptr().0,
            q_d.ptr().0,
            r_d.ptr().0,
            c_d.ptr().0,
            sel_p,
            s_d.ptr().0,
            pos_d.ptr().0,
            c.n_comp as u32,
            nt,
        ) {
            gpu.run(&l)?;
        }
        Ok((out.to_vec::<f32>()?, plan.n_split))
    };
    let ((got, n_split), (direct, n_direct)) = (split(c.max_rows)?, split(rows)?);
    let want = out_exact.to_vec::<f32>()?;
    let differ = got
        .iter()
        .zip(&direct)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    let mut result = close_scaled(
        name,
        &got,
        &want,
        FAST_TOL,
        format!(
            "{} tok at {}, {n_head}x{head_dim}, {rows} rows, {n_split} blocks a token; {differ} outputs \
             differ in bits with {n_direct} blocks (must be 0)",
            c.n_tok, c.pos0
        ),
    );
    if differ > 0 {
        result.verdict = Verdict::Fail;
    }
    Ok(result)
}
