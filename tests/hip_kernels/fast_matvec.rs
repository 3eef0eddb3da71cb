//! The fast decode matvecs and routed-expert kernels (kernels/matvec_fast.hip, kernels/moe_fast.hip)
//! against their exact twins on the same random inputs, over the shapes that pick each path: Q8_0
//! rows of 1 to 64 tiled chunks (whole rows per warp tile, and rows split over warps), grouped rows,
//! the untiled fallback, the routed experts of every format with odd row counts. Float outputs
//! within FAST_TOL × max|exact|: the sums are the exact kernels' products added in another order
//! (a few ulps of the largest partial sums). The paired launch (kernels::fast_fusions) must give the
//! bits of the two fast launches it replaces.

use ds4_chat::backend::hip::kernels::{self, ExpertFormat, FastGrids, Launch, Q8Proj};
use ds4_chat::backend::hip::runtime::{DeviceBuffer, HipResult};
use ds4_chat::gguf::GgmlType;

use super::moe_case::{DownCase, GateUpCase};
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
    let q8_0_name = |(n_in, n_out, group, n_tok)| format!("fast_matvec.q8_0[{n_in}x{n_out},group {group},{n_tok} tok]");
    each(gpu, rng, emit, q8_0_cases, q8_0_name, check_q8_0);
    // Few blocks, so that each takes 6 or 7 rounds in turn (the next round's tile in flight across
    // rounds and, for 8192 columns, K split over warps): the bits of the default grid.
    let few_cases = [(8192usize, 64usize, 1usize), (1024, 600, 2)];
    let few_name = |(n_in, n_out, n_tok)| format!("fast_matvec.q8_0_few_blocks[{n_in}x{n_out},{n_tok} tok]");
    each(gpu, rng, emit, few_cases, few_name, check_q8_0_few_blocks);
    // At least 19 rows a case, so that some gate is positive: were every gate negative, every output
    // would sit in silu's exponential tail, where its relative error is its gate's absolute error and
    // 1e-5 of max|ref| is no bound (16384x5 failed so under wave64 once the checks before it drew
    // other inputs: max|ref| 5.0e-13, max_rel 2.2e-5).
    let swiglu_cases = [(4096usize, 45usize, 2usize), (16384, 21, 1), (512, 19, 1), (768, 23, 1)];
    let swiglu_name = |(n_in, n_ff, n_tok)| format!("fast_matvec.q8_0_swiglu[{n_in}x{n_ff},{n_tok} tok]");
    each(gpu, rng, emit, swiglu_cases, swiglu_name, check_swiglu);
    for fmt in ExpertFormat::ALL {
        let name = format!("fast_matvec.moe_gate_up_{}[2048x37,2 tok]", fmt_name(fmt));
        emit(guard(&name, || check_gate_up(gpu, rng, &name, fmt)));
        // Six Q4_K rows of 2048 elements (6,912 bytes) are past a job: 1024 for Q4_K.
        let n_ff = if fmt == ExpertFormat::Q4K { 1024 } else { 2048 };
        let name = format!("fast_matvec.moe_down_{}[{n_ff}x45,2 tok]", fmt_name(fmt));
        emit(guard(&name, || check_down(gpu, rng, &name, fmt, n_ff)));
    }
    emit(guard("fast_matvec.moe_twins_decline", || Ok(check_declines())));
    for fmt in ExpertFormat::ALL {
        let name = format!("fast_matvec.moe_gate_up_q8k_{}[4096x512,2 tok]", fmt_name(fmt));
        emit(guard(&name, || check_gate_up_quantized(gpu, rng, &name, fmt)));
    }
    // Paired: the query and kv down-projections' shape, rows ending on a round.
    let pair_cases = [(4096usize, 64usize, 24usize, 1usize), (1024, 32, 13, 2)];
    let pair_name = |(n_in, n0, n1, n_tok)| format!("fast_matvec.q8_0_pair[{n_in}x({n0}+{n1}),{n_tok} tok]");
    each(gpu, rng, emit, pair_cases, pair_name, check_pair);
    // Quantized output: the attention's grouped low-rank output (4096-column groups, 8 rows a round,
    // 4 rounds a Q8_0 block of rows), 2 rounds a block (8192 columns, K split), 64 rows a round.
    let quant_cases = [
        (4096usize, 256usize, 64usize, 1usize),
        (8192, 96, 96, 2),
        (512, 192, 192, 1),
    ];
    let quant_name =
        |(n_in, n_out, group, n_tok)| format!("fast_matvec.q8_0_quantized[{n_in}x{n_out},group {group},{n_tok} tok]");
    each(gpu, rng, emit, quant_cases, quant_name, check_quantized);
    // The query's up-projection of its normed down-projection (1024 columns, 4 chunks a row), a
    // round per 32 rows; the smallest and largest rows the fused norm takes.
    let normed_cases = [(1024usize, 320usize, 1usize), (256, 131, 2), (2048, 40, 1)];
    let normed_name = |(n_in, n_out, n_tok)| format!("fast_matvec.q8_0_normed[{n_in}x{n_out},{n_tok} tok]");
    each(gpu, rng, emit, normed_cases, normed_name, check_normed);
    // The router's logits and selection in one launch: top-k with bias and hash layers, 1 and 3 tokens.
    let router_cases = [(false, 1usize), (true, 1), (false, 3)];
    let router_name = |(hash, n_tok)| {
        let kind = if hash { "hash" } else { "topk+bias" };
        format!("fast_matvec.f16_router[{kind},{n_tok} tok]")
    };
    each(gpu, rng, emit, router_cases, router_name, check_router);
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

/// `ds4_matvec_f16_router_fast` against the fast F16 matvec followed by the fast router: the same
/// logits, expert ids and weights, bit for bit, launched twice (the finishers put the counters back,
/// so a second launch, as a replayed graph's, selects again).
fn check_router(gpu: &Gpu, rng: &mut CheckRng, name: &str, (hash, n_tok): (bool, usize)) -> Checked {
    let (n_in, n_expert, n_used, scale) = (1024usize, 256usize, 6usize, 1.5f32);
    let case = F16ProjCase::new(gpu, rng, 2, (n_in, n_expert, n_tok), n_in)?;
    let bias = gpu.up(&random_vec(rng, n_expert, 0.05))?;
    let tokens: Vec<u32> = (0..n_tok).map(|_| rng.int_in(0, 99) as u32).collect();
    let table: Vec<u32> = (0..100 * n_used)
        .map(|_| rng.int_in(0, n_expert as i64 - 1) as u32)
        .collect();
    let (tokens, table) = (gpu.up(&tokens)?, gpu.up(&table)?);
    let counter = gpu.up(&vec![0u32; n_tok])?;
    let outs = || -> HipResult<(DeviceBuffer, DeviceBuffer)> {
        Ok((
            gpu.poisoned::<u32>(n_tok * n_used)?,
            gpu.poisoned::<f32>(n_tok * n_used)?,
        ))
    };
    let router = |sel: &DeviceBuffer, selw: &DeviceBuffer, logits: &DeviceBuffer| {
        kernels::router(
            sel.ptr().0,
            selw.ptr().0,
            logits.ptr().0,
            if hash { kernels::NULL } else { bias.ptr().0 },
            if hash { table.ptr().0 } else { kernels::NULL },
            tokens.ptr().0,
            n_expert as u32,
            n_used as u32,
            scale,
            n_tok as u32,
        )
    };
    let (sel_want, selw_want) = outs()?;
    run_fast(
        gpu,
        &[
            case.single(kernels::matvec_f16),
            router(&sel_want, &selw_want, &case.ys[0]),
        ],
    )?;
    let (mut notes, mut pass) = (Vec::new(), true);
    let want_ids = sel_want.to_vec::<u32>()?;
    let want_w = selw_want.to_vec::<f32>()?;
    let want_logits = case.ys[0].to_vec::<f32>()?;
    // The same product into the second output.
    let [y1, w, x] = [&case.ys[1], &case.ws[0], &case.x].map(|b| b.ptr().0);
    let logits = kernels::matvec_f16(y1, w, x, n_in as u32, n_expert as u32, n_in as u32, n_tok as u32);
    for launch in 0..2 {
        let (sel, selw) = outs()?;
        let fused = kernels::matvec_f16_router(&logits, &router(&sel, &selw, &case.ys[1]), counter.ptr().0)
            .expect("the fused router takes this shape");
        gpu.run(&fused)?;
        let ids_same = sel.to_vec::<u32>()? == want_ids;
        let weights = same_bits(name, &selw.to_vec::<f32>()?, &want_w, "weights".into());
        let lg = same_bits(name, &case.ys[1].to_vec::<f32>()?, &want_logits, "logits".into());
        pass &= ids_same && weights.verdict == Verdict::Pass && lg.verdict == Verdict::Pass;
        notes.push(format!(
            "launch {launch}: ids {}; {}; {}",
            if ids_same { "equal" } else { "DIFFER" },
            weights.note,
            lg.note
        ));
    }
    finisher_result(name, &counter, pass, notes)
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

const N_EXPERT: usize = 8;
const N_USED: usize = 6;
const N_TOK: usize = 2;

/// The Q4_K routed gate/up twin against its exact kernel: max|fast − exact| ≤ this × max|exact|.
/// A K-quant chunk term subtracts its min offset (dmin · min · block sums) from its scaled integer
/// sum, so the 2048 terms of a gate or up dot can be several times the dot, and a reordered sum
/// moves by a few ulps of the terms, not of the dot; silu(gate) · up then multiplies two such
/// dots, while the limit-2 clamp keeps max|exact| near 4. Measured on the emulator (seeds 1, 3, 5,
/// 9, 10, 11 and the inputs of a CI run): Q4_K 3.9e-6 to 1.15e-5 of max|exact|, over FAST_TOL in
/// 3 of those 7; Q2_K at most 1.4e-6 and IQ2_XXS (no offset) at most 2.9e-6, which keep FAST_TOL.
/// The bound leaves 2.6x margin over the largest Q4_K figure.
const Q4_K_GATE_UP_TOL: f64 = 3e-5;

fn check_gate_up(gpu: &Gpu, rng: &mut CheckRng, name: &str, fmt: ExpertFormat) -> Checked {
    let (n_in, n_ff, limit) = (2048usize, 37usize, 2.0f32);
    let shape = (n_in, n_ff, N_EXPERT, N_USED);
    let mut case = GateUpCase::new(gpu, rng, fmt, shape, (N_TOK, limit, true))?;
    let l = case.launch();
    let note = format!("{N_USED}/{N_EXPERT} experts, limit {limit}");
    let tol = if fmt == ExpertFormat::Q4K {
        Q4_K_GATE_UP_TOL
    } else {
        FAST_TOL
    };
    fast_within(gpu, name, &l, &mut [&mut case.mid], tol, note)
}

fn check_down(gpu: &Gpu, rng: &mut CheckRng, name: &str, fmt: ExpertFormat, n_ff: usize) -> Checked {
    let mut case = DownCase::new(gpu, rng, fmt, (n_ff, 45, N_EXPERT, N_USED), (N_TOK, true))?;
    let l = case.launch();
    fast_within_tol(
        gpu,
        name,
        &l,
        &mut [&mut case.out],
        format!("{N_USED}/{N_EXPERT} experts"),
    )
}

/// `ds4_moe_gate_up_<fmt>_q8k_fast` against the fast gate/up followed by the fast Q8_K quantization
/// of its mid rows (`quantize_rows`): the same mid, codes, scales and 16-element sums, bit for bit,
/// with 16, 64 and 256 rows a block (16, 4 and 1 blocks a 256-element unit; the unit counters go
/// back to 0 after each launch, so the next one, as a replayed graph's, quantizes again). 512 rows:
/// two units a slot.
fn check_gate_up_quantized(gpu: &Gpu, rng: &mut CheckRng, name: &str, fmt: ExpertFormat) -> Checked {
    // Q4_K rows of 4096 (two of them 4,608 bytes) fit its 5,120-byte jobs; the others likewise.
    let (n_in, n_ff, limit) = (4096usize, 512usize, 2.0f32);
    let mut case = GateUpCase::new(gpu, rng, fmt, (n_in, n_ff, N_EXPERT, N_USED), (N_TOK, limit, true))?;
    let rows = N_TOK * N_USED * n_ff;
    let quant = |p: &QuantOutBuffers, mid: &DeviceBuffer| {
        let o = p.planes();
        let q8_k = kernels::QuantOut {
            q8_k_q: o.q8_k_q,
            q8_k_d: o.q8_k_d,
            q8_k_bs: o.q8_k_bs,
            ..Default::default()
        };
        kernels::quantize_rows(q8_k, mid.ptr().0, n_ff as u32, (N_TOK * N_USED) as u32)
    };
    // The Q8_K codes, scales and 16-element sums.
    let read = |p: &QuantOutBuffers| -> HipResult<(Vec<i8>, Vec<f32>, Vec<i16>)> {
        Ok((p.0[3].to_vec::<i8>()?, p.0[4].to_vec::<f32>()?, p.0[5].to_vec::<i16>()?))
    };
    let want = QuantOutBuffers::poisoned(gpu, rows)?;
    let gate_up = case.launch();
    run_fast(gpu, &[gate_up.clone(), quant(&want, &case.mid)])?;
    let want_mid = case.mid.to_vec::<f32>()?;
    let (want_q, want_d, want_bs) = read(&want)?;
    let counter = gpu.up(&vec![0u32; rows / 256])?;
    let (mut notes, mut pass) = (Vec::new(), true);
    for moe_rows in [16, 64, 256] {
        let grids = FastGrids {
            moe_rows,
            ..FastGrids::default()
        };
        let got = QuantOutBuffers::poisoned(gpu, rows)?;
        gpu.repoison([&mut case.mid])?;
        let fused = kernels::moe_gate_up_quantized(&gate_up, &quant(&got, &case.mid), counter.ptr().0, grids)
            .expect("the fused gate/up takes this shape");
        gpu.run(&fused)?;
        let (q, d, bs) = read(&got)?;
        let mid = same_bits(name, &case.mid.to_vec::<f32>()?, &want_mid, "mid".into());
        let codes = same_codes(name, &q, &want_q, "codes".into());
        let scales = same_bits(name, &d, &want_d, "scales".into());
        let sums_same = bs == want_bs;
        pass &= [mid.verdict, codes.verdict, scales.verdict]
            .iter()
            .all(|v| *v == Verdict::Pass)
            && sums_same;
        let sums = if sums_same { "sums equal" } else { "sums DIFFER" };
        let blocks = fused.grid[0];
        notes.push(format!(
            "{moe_rows} rows ({blocks} blocks): {}; {}; {}; {sums}",
            mid.note, codes.note, scales.note
        ));
    }
    finisher_result(name, &counter, pass, notes)
}

/// Rows that are not 16-byte multiples, or jobs over their kernel's staging size, keep the exact
/// kernels; the Flash-shaped files' jobs are taken.
fn check_declines() -> CheckResult {
    let q = kernels::Q8K { q: 1, d: 2, bsums: 3 };
    let cases = [
        // IQ2_XXS rows of 768 elements: 198 bytes.
        kernels::moe_gate_up(ExpertFormat::Iq2Xxs, 1, 2, 3, q, 4, 5, 768, 64, 6, 7.0, 1),
        // 6 Q4_K rows of 2048 elements: 6,912 bytes, past a 4,608-byte job.
        kernels::moe_down(ExpertFormat::Q4K, 1, 2, q, 4, 2048, 64, 6, 1),
        // Two IQ2_XXS rows of 5120 elements: 2,640 bytes, past the 2,560 of its gate/up jobs.
        kernels::moe_gate_up(ExpertFormat::Iq2Xxs, 1, 2, 3, q, 4, 5, 5120, 64, 6, 7.0, 1),
    ];
    let declined = cases.iter().filter(|l| kernels::fast_twin(l).is_none()).count();
    let took = [
        // The Flash-shaped q2 file: IQ2_XXS gate/up of 4096 columns (2,112 bytes), Q2_K down of 2048
        // for 6 experts (4,032); and IQ2_XXS down rows of 2048 (3,168).
        kernels::moe_gate_up(ExpertFormat::Iq2Xxs, 1, 2, 3, q, 4, 5, 4096, 2048, 6, 7.0, 1),
        kernels::moe_down(ExpertFormat::Q2K, 1, 2, q, 4, 2048, 64, 6, 1),
        kernels::moe_down(ExpertFormat::Iq2Xxs, 1, 2, q, 4, 2048, 64, 6, 1),
        // The q4 file's gate/up: two Q4_K rows of 4096 (4,608).
        kernels::moe_gate_up(ExpertFormat::Q4K, 1, 2, 3, q, 4, 5, 4096, 2048, 6, 7.0, 1),
    ];
    let ok = declined == cases.len() && took.iter().all(|l| kernels::fast_twin(l).is_some());
    CheckResult::measured(
        "fast_matvec.moe_twins_decline",
        (cases.len() - declined) as f64,
        0.0,
        0.0,
        ok,
        format!("{declined}/{} declined", cases.len()),
    )
}
