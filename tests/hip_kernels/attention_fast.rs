//! The fast attention (kernels/attention_fast.hip) against the exact attention kernels on the same
//! random rows.
//!
//! Decode (rows split over slices, then a merge): short contexts, a full ratio-4 window with the
//! indexer's selection and a wrapped ring, and the ratio-128 rows of 70k and 1M tokens; each
//! launched with the split count a captured decode graph uses (the session's most rows), so most
//! slices exit, and again with the grid a direct launch sizes to the batch's rows, which must give
//! the same bits (a replayed decode graph equals direct launches). Float outputs within FAST_TOL x
//! max|exact|: each output is a softmax-weighted mean of rows whose sums are reordered (a few ulps
//! of the largest partial sums). The slices on matrix cores (`ds4_attention_decode_split_mma`,
//! 32-lane warps only) take f16 operands: within the prefill kernel's bound, ATT_TOL x max|row|,
//! graph and direct grids again equal.
//!
//! Prefill (`ds4_attention_prefill_fast`, matrix cores) against the exact sequence (scores →
//! softmax → weighted values, itself bitwise equal to the CPU reference: group `attention`):
//! batches of 1, 37 and 256 tokens over the window only, over compressed rows, and over the
//! indexer's selection of them.
//!
//! Bound: q, the rows and the softmax weights enter the tiles as f16 (11-bit significands, relative
//! error <= 2^-11 each) with f32 sums, so a score s = scale·Σ q_i k_i moves by at most
//! 2^-10·scale·Σ|q_i k_i| and an output by that times the spread of the rows it mixes plus the
//! weights' and rows' own 2^-11. With the inputs below (|q|, |row| <= 1, head_dim 512) that is a few
//! 1e-3 of max|row| at worst; outputs are averages of the rows, so max|ref| is smaller than max|row|
//! and the check bounds |fast − exact| by ATT_TOL · max|row| (the reported max_abs is absolute).

use ds4_chat::backend::hip::kernels::{self, AttentionSplitPlan};
use ds4_chat::backend::hip::runtime::{DeviceBuffer, HipResult};
use ds4_chat::gguf::half::round_f16;

use super::attention_case::{AttentionCase, attention_shape};
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
        |c| format!("attention_fast.decode_split[{}]", c.label),
        check_split,
    );
    let prefill_cases: [PrefillCase; 7] = [
        ("window only, 1 tok", 1, 300, 64, 512, 0, 0, 0),
        ("window only, 37 tok from 0", 37, 0, 64, 512, 0, 0, 0),
        ("window only, 256 tok", 256, 200, 8, 128, 0, 0, 0),
        ("ratio128 rows, 37 tok", 37, 5000, 64, 512, 128, 40, 0),
        ("ratio4 rows, 256 tok", 256, 100, 8, 128, 4, 90, 0),
        ("ratio4 +indexer sel, 37 tok", 37, 2000, 64, 512, 4, 510, 96),
        ("ratio4 +indexer sel, 256 tok", 256, 1000, 8, 128, 4, 314, 40),
    ];
    // The kernel's tiles are laid out for 32-lane warps: a 64-lane device keeps the exact sequence
    // (`Pass::attention_prefill_fast`), so the wave64 rerun has none of it to check.
    for case in prefill_cases.into_iter().filter(|_| !wave_rerun()) {
        let name = format!("kernel.attention_prefill_fast[{}]", case.0);
        emit(guard(&name, || check_prefill(gpu, rng, &name, case)));
    }
}

/// |fast − exact| <= ATT_TOL · max|visible row| (see the file comment); also the bound of the decode
/// split's slices on matrix cores (the decode checks above), the same tiles.
pub(super) const ATT_TOL: f64 = 2e-3;

/// ATT_TOL · max|visible row| as `close_scaled`'s tolerance (relative to max|want|), and max|row|.
pub(super) fn att_tol_scaled(case: &AttentionCase, want: &[f32]) -> (f64, f64) {
    let row_max = case
        .ring
        .iter()
        .chain(&case.comp)
        .fold(0f64, |m, &v| m.max(v.abs() as f64));
    let ref_max = want.iter().fold(0f64, |m, &v| m.max(v.abs() as f64));
    (ATT_TOL * row_max / ref_max.max(f64::MIN_POSITIVE), row_max)
}

/// One case: label, tokens, first position, heads, head_dim, ratio, compressed rows in the cache,
/// top_k (0 = no indexer selection).
type PrefillCase = (&'static str, usize, usize, usize, usize, usize, usize, usize);

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

fn check_prefill(gpu: &Gpu, rng: &mut CheckRng, name: &str, case: PrefillCase) -> Checked {
    let (_, n_tok, pos0, n_head, head_dim, ratio, n_comp, top_k) = case;
    let window = 128usize;
    let ring_cap = window + n_tok - 1;
    let shape = attention_shape(n_head, head_dim, ring_cap, window, ratio, top_k);
    // Compressed rows are f16-rounded in the cache (ds4_rows_finish ROUND_F16).
    let case = AttentionCase::new(gpu, rng, shape, n_tok, pos0, n_comp, round_f16)?;
    let rows = case.rows();
    let exact = gpu.poisoned::<f32>(n_tok * n_head * head_dim)?;
    case.run_exact(gpu, &exact, rows)?;
    let fast = gpu.poisoned::<f32>(n_tok * n_head * head_dim)?;
    gpu.run(&kernels::attention_prefill_fast(
        &shape,
        fast.ptr().0,
        &case.inputs(),
        n_tok as u32,
    ))?;
    let (got, want) = (fast.to_vec::<f32>()?, exact.to_vec::<f32>()?);
    let (tol, row_max) = att_tol_scaled(&case, &want);
    let r = close_scaled(
        name,
        &got,
        &want,
        tol,
        format!(
            "{n_tok} tok at {pos0}, {n_head}x{head_dim}, up to {rows} rows; bound {ATT_TOL:e} x max|row| {row_max:.2}"
        ),
    );
    Ok(r)
}
