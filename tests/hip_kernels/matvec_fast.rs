//! The fast decode matvecs (kernels/matvec_fast.hip) against their exact twins on the same random
//! inputs, over the shapes that pick each path: Q8_0 rows of 1 to 64 tiled chunks (whole rows per
//! warp tile, and rows split over warps), grouped rows, the untiled fallback. Float outputs within
//! FAST_TOL × max|exact|: the sums are the exact kernels' products added in another order (a few
//! ulps of the largest partial sums).
//!
//! The launches that replace several fast launches (`kernels::paired_matvec_q8_0`,
//! `matvec_q8_0_quantized`, `matvec_q8_0_normed`) must give the bits of the launches they replace.
//! So must the products that finish their output units (`kernels::matvec_q8_0_normed_rows`,
//! `matvec_f16_normed_hadamard`, `matvec_q8_0_swiglu_quantized`), in every output (the heads, the
//! kv row and its ring row, the SwiGLU's output and its Q8_0 planes), launched twice (the
//! finishers put their counters back, so a second launch, as a replayed graph's, finishes again),
//! on grids where a block finishes several heads and where many blocks share a head.

use ds4_chat::backend::cpu::ops::Rope;
use ds4_chat::backend::hip::kernels::{self, FastGrids, Launch, Q8Proj, QuantOut, RopeParams, row_flags as rf};
use ds4_chat::backend::hip::runtime::{DeviceBuffer, HipResult};
use ds4_chat::gguf::GgmlType;
use ds4_chat::model::hparams::HParams;

use super::support::*;

/// Every check of this file.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    // (n_in, n_out, rows_per_group, n_tok): 1, 4, 16, 32 and 64 chunks a row, grouped, 3 chunks.
    let q8_0_cases = [
        (256usize, 131usize, 131usize, 1usize),
        (1024, 200, 50, 2),
        (4096, 37, 37, 2),
        (8192, 21, 7, 1),
        (16384, 9, 9, 2),
        (768, 45, 45, 1),
    ];
    let q8_0_name = |(n_in, n_out, group, n_tok)| format!("matvec_fast.q8_0[{n_in}x{n_out},group {group},{n_tok} tok]");
    each(gpu, rng, emit, q8_0_cases, q8_0_name, check_q8_0);
    // Few blocks, so that each takes 6 or 7 rounds in turn (the next round's tile in flight across
    // rounds and, for 8192 columns, K split over warps): the bits of the default grid.
    let few_cases = [(8192usize, 64usize, 1usize), (1024, 600, 2)];
    let few_name = |(n_in, n_out, n_tok)| format!("matvec_fast.q8_0_few_blocks[{n_in}x{n_out},{n_tok} tok]");
    each(gpu, rng, emit, few_cases, few_name, check_q8_0_few_blocks);
    // At least 19 rows a case, so that some gate is positive: were every gate negative, every output
    // would sit in silu's exponential tail, where its relative error is its gate's absolute error and
    // 1e-5 of max|ref| is no bound (16384x5 failed so under wave64 once the checks before it drew
    // other inputs: max|ref| 5.0e-13, max_rel 2.2e-5).
    let swiglu_cases = [(4096usize, 45usize, 2usize), (16384, 21, 1), (512, 19, 1), (768, 23, 1)];
    let swiglu_name = |(n_in, n_ff, n_tok)| format!("matvec_fast.q8_0_swiglu[{n_in}x{n_ff},{n_tok} tok]");
    each(gpu, rng, emit, swiglu_cases, swiglu_name, check_swiglu);
    // Paired: the query and kv down-projections' shape, rows ending on a round.
    let pair_cases = [(4096usize, 64usize, 24usize, 1usize), (1024, 32, 13, 2)];
    let pair_name = |(n_in, n0, n1, n_tok)| format!("matvec_fast.q8_0_pair[{n_in}x({n0}+{n1}),{n_tok} tok]");
    each(gpu, rng, emit, pair_cases, pair_name, check_pair);
    // Quantized output: the attention's grouped low-rank output (4096-column groups, 8 rows a round,
    // 4 rounds a Q8_0 block of rows), 2 rounds a block (8192 columns, K split), 64 rows a round.
    let quant_cases = [
        (4096usize, 256usize, 64usize, 1usize),
        (8192, 96, 96, 2),
        (512, 192, 192, 1),
    ];
    let quant_name =
        |(n_in, n_out, group, n_tok)| format!("matvec_fast.q8_0_quantized[{n_in}x{n_out},group {group},{n_tok} tok]");
    each(gpu, rng, emit, quant_cases, quant_name, check_quantized);
    // The query's up-projection of its normed down-projection (1024 columns, 4 chunks a row), a
    // round per 32 rows; the smallest and largest rows the fused norm takes.
    let normed_cases = [(1024usize, 320usize, 1usize), (256, 131, 2), (2048, 40, 1)];
    let normed_name = |(n_in, n_out, n_tok)| format!("matvec_fast.q8_0_normed[{n_in}x{n_out},{n_tok} tok]");
    each(gpu, rng, emit, normed_cases, normed_name, check_normed);
    // The query's up-projection into heads of the Flash width (512), fewer of them.
    for n_tok in [1usize, 2] {
        let name = format!("matvec_fast.q8_0_normed_rows[1024x(6x512),{n_tok} tok]");
        emit(guard(&name, || check_normed_rows(gpu, rng, &name, (6, n_tok))));
    }
    // The shared expert's SwiGLU (4096 columns, 16 chunks a row; 2048 rows are 8 units of 256).
    for n_tok in [1usize, 2] {
        let name = format!("matvec_fast.q8_0_swiglu_q8[4096x2048,{n_tok} tok]");
        emit(guard(&name, || {
            check_swiglu_quantized(gpu, rng, &name, (4096, 2048, n_tok))
        }));
    }
    // The indexer's query heads (the Flash head width, 128), fewer of them.
    for n_tok in [1usize, 2] {
        let name = format!("matvec_fast.f16_normed_hadamard[1024x(12x128),{n_tok} tok]");
        emit(guard(&name, || check_normed_hadamard(gpu, rng, &name, (12, n_tok))));
    }
}

/// A check made of several bitwise comparisons: `pass` when all of them passed, their notes joined.
fn all_passed(name: &str, pass: bool, notes: Vec<String>) -> CheckResult {
    CheckResult::measured(name, f64::from(u8::from(!pass)), 0.0, 0.0, pass, notes.join("; "))
}

/// The result of a check of a launch with finishing blocks: it passes when every comparison did and
/// the finishers' counters are back to 0 (so the next launch, as a replayed graph's, finishes again).
pub fn finisher_result(name: &str, counter: &DeviceBuffer, pass: bool, mut notes: Vec<String>) -> Checked {
    let back = counter.to_vec::<u32>()?.iter().all(|&c| c == 0);
    notes.push(format!("counters {}", if back { "back to 0" } else { "NOT reset" }));
    Ok(all_passed(name, pass && back, notes))
}

/// `ds4_matvec_q8_0_q8_fast` against the fast matvec followed by the fast Q8_0 quantization of its
/// rows (`quantize_rows`): the same codes and scales, bit for bit, with grids of 3 blocks (a block
/// gathers several Q8_0 blocks of rows in turn) and of 264.
fn check_quantized(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    (n_in, n_out, group, n_tok): (usize, usize, usize, usize),
) -> Checked {
    let nt = n_tok as u32;
    let case = Q8ProjCase::new(gpu, rng, (n_in, n_out, group, n_tok))?;
    run_fast(gpu, &[kernels::matvec_q8_0(&case.proj, nt)])?;
    let planes = || -> HipResult<(DeviceBuffer, DeviceBuffer)> {
        Ok((
            gpu.poisoned::<i8>(n_tok * n_out)?,
            gpu.poisoned::<f32>(n_tok * n_out / 32)?,
        ))
    };
    let (q_want, d_want) = planes()?;
    let quant = kernels::QuantOut::q8_0(q_want.ptr().0, d_want.ptr().0);
    run_fast(gpu, &[kernels::quantize_rows(quant, case.proj.y, n_out as u32, nt)])?;
    let (q_want, d_want) = (q_want.to_vec::<i8>()?, d_want.to_vec::<f32>()?);
    let (mut notes, mut pass) = (Vec::new(), true);
    for grids in FEW_AND_DEFAULT_BLOCKS {
        let (q, d) = planes()?;
        let fused = kernels::matvec_q8_0_quantized(&case.proj, (q.ptr().0, d.ptr().0), nt, grids)
            .expect("the quantized launch takes this shape");
        gpu.run(&fused)?;
        let grid = fused.grid[0];
        let codes = same_codes(name, &q.to_vec::<i8>()?, &q_want, format!("grid {grid}: codes"));
        let scales = same_bits(name, &d.to_vec::<f32>()?, &d_want, "scales".into());
        pass &= codes.verdict == Verdict::Pass && scales.verdict == Verdict::Pass;
        notes.push(format!("{}; {}", codes.note, scales.note));
    }
    Ok(all_passed(name, pass, notes))
}

/// `ds4_matvec_q8_0_normed_fast` against the fast norm of f32 rows into Q8_0 planes followed by the
/// fast matvec of those planes: the same outputs, bit for bit, with grids of 3 blocks (a block norms
/// the row once and takes several rounds) and of 264.
fn check_normed(gpu: &Gpu, rng: &mut CheckRng, name: &str, (n_in, n_out, n_tok): (usize, usize, usize)) -> Checked {
    let nt = n_tok as u32;
    let case = Q8ProjCase::new(gpu, rng, (n_in, n_out, n_out, n_tok))?;
    let x = gpu.up(&random_vec(rng, n_tok * n_in, 3.0))?;
    let norm_w: Vec<f32> = (0..n_in).map(|_| 1.0 + 0.5 * rng.next_f32()).collect();
    let norm_w = gpu.up(&norm_w)?;
    let (x, norm_w, eps) = (x.ptr().0, norm_w.ptr().0, 1e-6);
    let planes = kernels::QuantOut::q8_0(case.proj.x.q, case.proj.x.d);
    run_fast(
        gpu,
        &[
            kernels::norm_rows(planes, x, norm_w, n_in as u32, nt, eps),
            kernels::matvec_q8_0(&case.proj, nt),
        ],
    )?;
    let want = case.y.to_vec::<f32>()?;
    let (mut notes, mut pass) = (Vec::new(), true);
    for grids in FEW_AND_DEFAULT_BLOCKS {
        let y = gpu.poisoned::<f32>(n_tok * n_out)?;
        let proj = Q8Proj {
            y: y.ptr().0,
            ..case.proj
        };
        let fused =
            kernels::matvec_q8_0_normed(&proj, x, norm_w, eps, nt, grids).expect("the normed launch takes this shape");
        gpu.run(&fused)?;
        let got = same_bits(name, &y.to_vec::<f32>()?, &want, format!("grid {}", fused.grid[0]));
        pass &= got.verdict == Verdict::Pass;
        notes.push(got.note);
    }
    Ok(all_passed(name, pass, notes))
}

/// The fused and plain launches' grid: at most 3 blocks, so a block takes several rounds in turn (and prefetches
/// across the two matrices). The grid never changes the bits.
const FEW_BLOCKS: FastGrids = FastGrids {
    q8_0_max_blocks: 3,
    attention_rows: kernels::ATTENTION_SPLIT_ROWS,
    attention_mma_rows: 0,
    moe_rows: kernels::MOE_FAST_ROWS,
    indexer_decode_tokens: kernels::INDEXER_DECODE_MAX_TOKENS,
};

/// [`FEW_BLOCKS`] and the default grid's blocks (`Q8_0_FAST_MAX_BLOCKS`): the fused Q8_0 products
/// must give the same bits with either.
pub const FEW_AND_DEFAULT_BLOCKS: [FastGrids; 2] = [
    FEW_BLOCKS,
    FastGrids {
        q8_0_max_blocks: kernels::Q8_0_FAST_MAX_BLOCKS,
        ..FEW_BLOCKS
    },
];

/// Runs the fast twins of `launches` in turn.
pub fn run_fast(gpu: &Gpu, launches: &[Launch]) -> HipResult<()> {
    launches
        .iter()
        .try_for_each(|l| gpu.run(&kernels::fast_twin(l).expect("a fast twin")))
}

/// `ds4_matvec_q8_0_pair_fast` against the two fast matvecs: the same bits.
fn check_pair(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    (n_in, n0, n1, n_tok): (usize, usize, usize, usize),
) -> Checked {
    let x = random_vec(rng, n_tok * n_in, 2.0);
    let (_, x_d) = gpu.up_q8_0(&x)?;
    let w0 = gpu.up(&random_weights(rng, GgmlType::Q8_0, n_in, n0))?;
    let w1 = gpu.up(&random_weights(rng, GgmlType::Q8_0, n_in, n1))?;
    let mut ys = Vec::new();
    for _ in 0..4 {
        ys.push(gpu.poisoned::<f32>(n_tok * n0.max(n1))?);
    }
    let proj = |y: &DeviceBuffer, w: &DeviceBuffer, n: usize| {
        Q8Proj::plain(y.ptr().0, w.ptr().0, x_d.act(), n_in as u32, n as u32)
    };
    let nt = n_tok as u32;
    run_fast(
        gpu,
        &[
            kernels::matvec_q8_0(&proj(&ys[0], &w0, n0), nt),
            kernels::matvec_q8_0(&proj(&ys[1], &w1, n1), nt),
        ],
    )?;
    let paired = kernels::paired_matvec_q8_0(&proj(&ys[2], &w0, n0), &proj(&ys[3], &w1, n1), nt, FEW_BLOCKS)
        .expect("the paired launch takes this shape");
    gpu.run(&paired)?;
    let read = |b: &DeviceBuffer, n: usize| -> HipResult<Vec<f32>> { Ok(b.to_vec::<f32>()?[..n_tok * n].to_vec()) };
    let (want, got) = (
        [read(&ys[0], n0)?, read(&ys[1], n1)?].concat(),
        [read(&ys[2], n0)?, read(&ys[3], n1)?].concat(),
    );
    Ok(same_bits(
        name,
        &got,
        &want,
        format!("{n_tok} tokens, grid {}", paired.grid[0]),
    ))
}

pub fn check_q8_0(gpu: &Gpu, rng: &mut CheckRng, name: &str, shape: (usize, usize, usize, usize)) -> Checked {
    let n_tok = shape.3;
    let mut case = Q8ProjCase::new(gpu, rng, shape)?;
    let l = kernels::matvec_q8_0(&case.proj, n_tok as u32);
    fast_within_tol(gpu, name, &l, &mut [&mut case.y], format!("{n_tok} tokens"))
}

/// The fast Q8_0 matvec on [`FEW_BLOCKS`] against the default grid: the same bits.
fn check_q8_0_few_blocks(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    (n_in, n_out, n_tok): (usize, usize, usize),
) -> Checked {
    let mut case = Q8ProjCase::new(gpu, rng, (n_in, n_out, n_out, n_tok))?;
    let l = kernels::matvec_q8_0(&case.proj, n_tok as u32);
    run_fast(gpu, std::slice::from_ref(&l))?;
    let want = case.y.to_vec::<f32>()?;
    gpu.repoison([&mut case.y])?;
    let few = kernels::fast_twin_tuned(&l, FEW_BLOCKS).expect("a fast twin");
    gpu.run(&few)?;
    let got = case.y.to_vec::<f32>()?;
    Ok(same_bits(
        name,
        &got,
        &want,
        format!("{n_tok} tokens, grid {}", few.grid[0]),
    ))
}

pub fn check_swiglu(gpu: &Gpu, rng: &mut CheckRng, name: &str, (n_in, n_ff, n_tok): (usize, usize, usize)) -> Checked {
    let mut case = Q8SwigluCase::new(gpu, rng, (n_in, n_ff, n_tok), 7.0)?;
    let l = kernels::matvec_q8_0_swiglu(&case.sw, n_tok as u32);
    fast_within_tol(gpu, name, &l, &mut [&mut case.mid], format!("{n_tok} tokens, clamp 7"))
}

fn rope() -> RopeParams {
    RopeParams::from_rope(&Rope::for_layer(&HParams::flash(), true))
}

/// `ds4_matvec_q8_0_normed_rows_fast` against `ds4_matvec_q8_0_normed_fast` then
/// `ds4_rows_finish_pair_fast` (the query heads and a kv row with its ring store).
fn check_normed_rows(gpu: &Gpu, rng: &mut CheckRng, name: &str, (n_head, n_tok): (usize, usize)) -> Checked {
    let (n_in, d, ring_cap, pos0) = (1024usize, 512usize, 64usize, 300u32);
    let n_out = n_head * d;
    let nt = n_tok as u32;
    let case = Q8ProjCase::new(gpu, rng, (n_in, n_out, n_out, n_tok))?;
    let x = gpu.up(&random_vec(rng, n_tok * n_in, 3.0))?;
    let norm_w = gpu.up(&(0..n_in).map(|_| 1.0 + 0.5 * rng.next_f32()).collect::<Vec<f32>>())?;
    let kv = random_vec(rng, n_tok * d, 3.0);
    let kv_w = gpu.up(&(0..d).map(|_| 1.0 + 0.3 * rng.next_f32()).collect::<Vec<f32>>())?;
    let pos = gpu.up(&[pos0])?;
    let counter = gpu.up(&vec![0u32; n_tok * n_head])?;
    let eps = 1e-6;
    // The outputs (heads, kv row, ring) after the launches `fused` picks, on fresh kv and ring.
    let run = |fused: Option<kernels::FastGrids>| -> HipResult<Vec<u8>> {
        let (y, kv_d, ring) = (
            gpu.poisoned::<f32>(n_tok * n_out)?,
            gpu.up(&kv)?,
            gpu.poisoned::<f32>(ring_cap * d)?,
        );
        let proj = kernels::Q8Proj {
            y: y.ptr().0,
            ..case.proj
        };
        let grids = fused.unwrap_or_default();
        let normed = kernels::matvec_q8_0_normed(&proj, x.ptr().0, norm_w.ptr().0, eps, nt, grids)
            .expect("the normed launch takes this shape");
        let heads = kernels::rows_finish(
            y.ptr().0,
            0,
            0,
            pos.ptr().0,
            n_head as u32,
            d as u32,
            rf::NORM | rf::ROPE,
            1,
            rope(),
            eps,
            nt,
        );
        let kv_flags = rf::NORM | rf::ROPE | rf::E4M3 | rf::STORE_RING;
        let kv_row = kernels::rows_finish(
            kv_d.ptr().0,
            ring.ptr().0,
            kv_w.ptr().0,
            pos.ptr().0,
            1,
            d as u32,
            kv_flags,
            ring_cap as u32,
            rope(),
            eps,
            nt,
        );
        let pair = kernels::fused_rows_finish_pair(&heads, &kv_row).expect("a paired launch for these rows");
        match fused {
            Some(_) => gpu.run(
                &kernels::matvec_q8_0_normed_rows(&normed, &pair, counter.ptr().0)
                    .expect("the fused launch takes this shape"),
            )?,
            None => {
                gpu.run(&normed)?;
                gpu.run(&pair)?;
            }
        }
        let mut bytes = y.to_vec::<u8>()?;
        bytes.extend(kv_d.to_vec::<u8>()?);
        bytes.extend(ring.to_vec::<u8>()?);
        Ok(bytes)
    };
    let want = run(None)?;
    let (mut notes, mut pass) = (Vec::new(), true);
    for grids in FEW_AND_DEFAULT_BLOCKS {
        for launch in 0..2 {
            let got = run(Some(grids))?;
            let same = got == want;
            pass &= same;
            notes.push(format!(
                "grid {} launch {launch}: {}",
                grids.q8_0_max_blocks,
                if same { "same bytes" } else { "BYTES DIFFER" }
            ));
        }
    }
    finisher_result(name, &counter, pass, notes)
}

/// `ds4_matvec_f16_normed_hadamard_fast` against `ds4_rms_norm_quant_fast` (f32 out),
/// `ds4_matvec_f16_fast` and `ds4_rows_finish_hadamard_fast` (RoPE and Hadamard/FP4 rows).
fn check_normed_hadamard(gpu: &Gpu, rng: &mut CheckRng, name: &str, (n_head, n_tok): (usize, usize)) -> Checked {
    let (n_in, d, pos0) = (1024usize, 128usize, 4100u32);
    let n_out = n_head * d;
    let nt = n_tok as u32;
    let mut case = F16ProjCase::new(gpu, rng, 1, (n_in, n_out, n_tok), n_in)?;
    let norm_w = gpu.up(&(0..n_in).map(|_| 1.0 + 0.5 * rng.next_f32()).collect::<Vec<f32>>())?;
    let xn = gpu.poisoned::<f32>(n_tok * n_in)?;
    let pos = gpu.up(&[pos0])?;
    let counter = gpu.up(&vec![0u32; n_tok * n_head])?;
    let eps = 1e-6;
    let [y, w, x] = [&case.ys[0], &case.ws[0], &case.x].map(|b| b.ptr().0);
    let norm = kernels::norm_rows(
        QuantOut {
            out: xn.ptr().0,
            ..Default::default()
        },
        x,
        norm_w.ptr().0,
        n_in as u32,
        nt,
        eps,
    );
    let product = kernels::matvec_f16(y, w, xn.ptr().0, n_in as u32, n_out as u32, n_in as u32, nt);
    let flags = rf::ROPE | rf::HADAMARD_FP4;
    let rows = kernels::rows_finish(y, 0, 0, pos.ptr().0, n_head as u32, d as u32, flags, 1, rope(), eps, nt);
    run_fast(gpu, &[norm.clone(), product.clone(), rows.clone()])?;
    let want = case.ys[0].to_vec::<f32>()?;
    let fused = kernels::matvec_f16_normed_hadamard(&norm, &product, &rows, counter.ptr().0)
        .expect("the fused launch takes this shape");
    let (mut notes, mut pass) = (Vec::new(), true);
    for launch in 0..2 {
        gpu.repoison([&mut case.ys[0]])?;
        gpu.run(&fused)?;
        let got = same_bits(name, &case.ys[0].to_vec::<f32>()?, &want, format!("launch {launch}"));
        pass &= got.verdict == Verdict::Pass;
        notes.push(got.note);
    }
    finisher_result(name, &counter, pass, notes)
}

/// `ds4_matvec_q8_0_swiglu_q8_fast` against `ds4_matvec_q8_0_swiglu_fast` then the fast Q8_0 of its
/// output as rows of 256 (the shared expert's mid row and its planes).
fn check_swiglu_quantized(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    (n_in, n_ff, n_tok): (usize, usize, usize),
) -> Checked {
    let nt = n_tok as u32;
    let case = Q8SwigluCase::new(gpu, rng, (n_in, n_ff, n_tok), 7.0)?;
    let counter = gpu.up(&vec![0u32; n_tok * n_ff / 256])?;
    let run = |fused: bool| -> HipResult<Vec<u8>> {
        let (mid, q, d) = (
            gpu.poisoned::<f32>(n_tok * n_ff)?,
            gpu.poisoned::<i8>(n_tok * n_ff)?,
            gpu.poisoned::<f32>(n_tok * n_ff / 32)?,
        );
        let s = kernels::Q8Swiglu {
            mid: mid.ptr().0,
            ..case.sw
        };
        let swiglu = kernels::matvec_q8_0_swiglu(&s, nt);
        let quant = kernels::quantize_rows(QuantOut::q8_0(q.ptr().0, d.ptr().0), mid.ptr().0, n_ff as u32, nt);
        match fused {
            true => gpu.run(
                &kernels::matvec_q8_0_swiglu_quantized(&swiglu, &quant, counter.ptr().0)
                    .expect("the fused launch takes this shape"),
            )?,
            false => run_fast(gpu, &[swiglu, quant])?,
        }
        let mut bytes = mid.to_vec::<u8>()?;
        bytes.extend(q.to_vec::<u8>()?);
        bytes.extend(d.to_vec::<u8>()?);
        Ok(bytes)
    };
    let want = run(false)?;
    let (mut notes, mut pass) = (Vec::new(), true);
    for launch in 0..2 {
        let same = run(true)? == want;
        pass &= same;
        notes.push(format!(
            "launch {launch}: {}",
            if same { "same bytes" } else { "BYTES DIFFER" }
        ));
    }
    finisher_result(name, &counter, pass, notes)
}
