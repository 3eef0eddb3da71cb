//! The fast decode attention (kernels/attention_fast.hip: rows split over slices, then a merge)
//! against the exact attention kernels on the same random rows: short contexts, a full ratio-4
//! window with the indexer's selection and a wrapped ring, and the ratio-128 rows of 70k and 1M
//! tokens; each launched with the split count a captured decode graph uses (the session's most
//! rows), so most slices exit, and again with the grid a direct launch sizes to the batch's rows,
//! which must give the same bits (a replayed decode graph equals direct launches). Float outputs
//! within FAST_TOL x max|exact|: each output is a softmax-weighted mean of rows whose sums are
//! reordered (a few ulps of the largest partial sums). The slices on matrix cores
//! (`ds4_attention_decode_split_mma`, 32-lane warps only) take f16 operands: within the prefill
//! kernel's bound, ATT_TOL x max|row| (fast_prefill_attention.rs), graph and direct grids again equal.
//! The segmented indexer top-k (kernels/indexer_fast.hip) against `ds4_indexer_topk`: a selection
//! without arithmetic, so the lists must be equal, ties (to the lower row) included.

use ds4_chat::backend::hip::kernels::{self, AttentionSplitPlan};
use ds4_chat::backend::hip::runtime::{DeviceBuffer, HipResult};

use super::attention_case::{AttentionCase, attention_shape};
use super::cache::IndexerInputs;
use super::fast_prefill_attention::{ATT_TOL, att_tol_scaled};
use super::support::*;

/// One attention case: tokens, first position, ratio, compressed rows in the cache, top_k (0 = no
/// selection), the most rows the launch is sized for, heads.
#[derive(Clone, Copy)]
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
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
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
    each(
        gpu,
        rng,
        emit,
        cases,
        |c| format!("fast_attention.decode_split[{}]", c.label),
        check_split,
    );
    let scores_name =
        |(n_head, n_comp, n_tok)| format!("fast_attention.indexer_scores[{n_head} heads, {n_comp} rows, {n_tok} tok]");
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
    let topk_name = |(n, top_k, seg, levels)| {
        format!("fast_attention.indexer_topk[{n} rows, top {top_k}, seg {seg}, levels {levels}]")
    };
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

fn check_split(gpu: &Gpu, rng: &mut CheckRng, name: &str, c: Case) -> Checked {
    let (head_dim, window, ring_cap) = (512usize, 128usize, 256usize);
    let n_head = c.n_head;
    let shape = attention_shape(n_head, head_dim, ring_cap, window, c.ratio, c.top_k);
    let case = AttentionCase::new(gpu, rng, shape, c.n_tok, c.pos0, c.n_comp, |v| v)?;
    let rows = case.rows();
    assert!(rows <= c.max_rows, "{name}: {rows} rows > {}", c.max_rows);
    let nt = c.n_tok as u32;
    // Exact: scores, softmax, values.
    let out_exact = gpu.poisoned::<f32>(c.n_tok * n_head * head_dim)?;
    case.run_exact(gpu, &out_exact, c.max_rows)?;
    // Fast: the split over the slices a graph sized for max_rows launches, and over the grid a
    // direct launch sizes to the batch's own rows: the same slices, so the same bits.
    let io = case.inputs();
    let split = |max_rows: u32, min_rows: u32, matrix_cores: bool| -> HipResult<(Vec<f32>, u32)> {
        let plan = AttentionSplitPlan::new(&shape, nt, max_rows, usize::MAX / 8, min_rows, matrix_cores)
            .expect("a split plan");
        let scratch =
            gpu.poisoned::<f32>(plan.acc_floats(&shape, nt) + 2 * c.n_tok * n_head * plan.n_split as usize)?;
        let out = gpu.poisoned::<f32>(c.n_tok * n_head * head_dim)?;
        for l in kernels::attention_decode_split(&shape, plan, out.ptr().0, scratch.ptr().0, &io, nt) {
            gpu.run(&l)?;
        }
        Ok((out.to_vec::<f32>()?, plan.n_split))
    };
    let default_rows = kernels::ATTENTION_SPLIT_ROWS;
    let ((got, n_split), (direct, n_direct)) = (
        split(c.max_rows, default_rows, false)?,
        split(rows, default_rows, false)?,
    );
    // Slices of 32 rows or more (fewer, longer partials merged; `DS4_HIP_ATTENTION_ROWS=32`).
    let (short, n_short) = split(c.max_rows, 32, false)?;
    let want = out_exact.to_vec::<f32>()?;
    let short_check = close_scaled(name, &short, &want, FAST_TOL, String::new());
    // The slices on matrix cores (`DS4_HIP_ATTENTION_MMA`), at 16 and at 32 rows a slice (one and
    // two tile steps), where the pass would use them (32-lane warps).
    let mut mma_ok = true;
    let mma_note = if wave_rerun() {
        "matrix cores: not on 64-lane warps".to_string()
    } else {
        let (tol, row_max) = att_tol_scaled(&case, &want);
        let mma_rows = kernels::ATTENTION_SPLIT_MMA_ROWS;
        let ((m_got, m_split), (m_direct, _)) = (split(c.max_rows, mma_rows, true)?, split(rows, mma_rows, true)?);
        let m_differ = m_got
            .iter()
            .zip(&m_direct)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        let m_check = close_scaled(name, &m_got, &want, tol, String::new());
        let (m_long, _) = split(c.max_rows, 2 * mma_rows, true)?;
        let long_check = close_scaled(name, &m_long, &want, tol, String::new());
        mma_ok = m_differ == 0 && m_check.verdict == Verdict::Pass && long_check.verdict == Verdict::Pass;
        format!(
            "matrix cores ({m_split} blocks of 32 heads): max_abs {:.3e} (bound {ATT_TOL:e} x max|row| {row_max:.2}), \
             {m_differ} outputs differ with the direct grid (must be 0); slices of {}+ rows: {:?}",
            m_check.max_abs,
            2 * mma_rows,
            long_check.verdict
        )
    };
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
             differ in bits with {n_direct} blocks (must be 0); slices of 32+ rows ({n_short} blocks): {:?}",
            c.n_tok, c.pos0, short_check.verdict
        ),
    );
    let fused = check_merge_q8(gpu, name, &shape, &io, (c.max_rows, c.n_tok), &got)?;
    result.note = format!(
        "{}; merge + inverse RoPE + Q8_0 in one launch: {}; {mma_note}",
        result.note, fused.note
    );
    if differ > 0 || short_check.verdict != Verdict::Pass || fused.verdict != Verdict::Pass || !mma_ok {
        result.verdict = Verdict::Fail;
    }
    Ok(result)
}

/// `ds4_attention_decode_merge_q8` against the merge's output `merged` (the plan for `max_rows`)
/// finished by the fast launches it replaces, `ds4_rows_finish_fast` (RoPE | ROPE_INVERSE, YaRN
/// angles) and `ds4_rms_norm_quant_fast` (Q8_0, no norm): the same codes and scales, bit for bit.
fn check_merge_q8(
    gpu: &Gpu,
    name: &str,
    shape: &kernels::AttentionShape,
    io: &kernels::AttentionInputs,
    (max_rows, n_tok): (u32, usize),
    merged: &[f32],
) -> Checked {
    let (nt, n_head, head_dim) = (n_tok as u32, shape.n_head, shape.head_dim);
    let rope = kernels::RopeParams::yarn(64, 160000.0, 16.0, 65536, 32.0, 1.0);
    let plan = AttentionSplitPlan::new(
        shape,
        nt,
        max_rows,
        usize::MAX / 8,
        kernels::ATTENTION_SPLIT_ROWS,
        false,
    )
    .expect("a split plan");
    let rows = n_tok * n_head as usize;
    let scratch = gpu.poisoned::<f32>(plan.acc_floats(shape, nt) + 2 * rows * plan.n_split as usize)?;
    let planes = || -> HipResult<(DeviceBuffer, DeviceBuffer)> {
        Ok((
            gpu.poisoned::<i8>(rows * head_dim as usize)?,
            gpu.poisoned::<f32>(rows * head_dim as usize / 32)?,
        ))
    };
    let (q_fused, d_fused) = planes()?;
    let fused = kernels::attention_decode_split_q8(
        shape,
        plan,
        rope,
        (q_fused.ptr().0, d_fused.ptr().0),
        scratch.ptr().0,
        io,
        nt,
    )
    .expect("a head_dim of whole Q8_0 blocks");
    for l in &fused {
        gpu.run(l)?;
    }
    let fast = |l: kernels::Launch| kernels::fast_twin(&l).expect("a fast twin");
    let out = gpu.up(merged)?;
    let flags = kernels::row_flags::ROPE | kernels::row_flags::ROPE_INVERSE;
    gpu.run(&fast(kernels::rows_finish(
        out.ptr().0,
        kernels::NULL,
        kernels::NULL,
        io.pos,
        n_head,
        head_dim,
        flags,
        1,
        rope,
        1e-6,
        nt,
    )))?;
    let (q_want, d_want) = planes()?;
    let quant = kernels::QuantOut::q8_0(q_want.ptr().0, d_want.ptr().0);
    gpu.run(&fast(kernels::quantize_rows(quant, out.ptr().0, head_dim, rows as u32)))?;
    let codes = same_codes(name, &q_fused.to_vec::<i8>()?, &q_want.to_vec::<i8>()?, "codes".into());
    let scales = same_bits(
        name,
        &d_fused.to_vec::<f32>()?,
        &d_want.to_vec::<f32>()?,
        "scales".into(),
    );
    let mut r = codes.clone();
    r.note = format!("{}; {}", codes.note, scales.note);
    if scales.verdict != Verdict::Pass {
        r.verdict = Verdict::Fail;
    }
    Ok(r)
}
