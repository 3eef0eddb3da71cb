//! The fast routing and routed-expert kernels (kernels/moe_fast.hip) against their exact twins on
//! the same random inputs: the routed experts of every format with odd row counts (float outputs
//! within FAST_TOL × max|exact|, Q4_K's gate/up within its own bound below), the shapes whose
//! launches keep the exact kernels, and the launches that replace two fast launches: the router's
//! logits with its selection (`kernels::matvec_f16_router`) and the routed gate/up with the Q8_K
//! quantization of its output (`kernels::moe_gate_up_quantized`), bit for bit.

use ds4_chat::backend::hip::kernels::{self, ExpertFormat, FastGrids};
use ds4_chat::backend::hip::runtime::{DeviceBuffer, HipResult};

use super::matvec_fast::{finisher_result, run_fast};
use super::moe_case::{DownCase, GateUpCase};
use super::support::*;

/// Every check of this file.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    for fmt in ExpertFormat::ALL {
        let name = format!("moe_fast.gate_up_{}[2048x37,2 tok]", fmt_name(fmt));
        emit(guard(&name, || check_gate_up(gpu, rng, &name, fmt)));
        // Six Q4_K rows of 2048 elements (6,912 bytes) are past a job: 1024 for Q4_K.
        let n_ff = if fmt == ExpertFormat::Q4K { 1024 } else { 2048 };
        let name = format!("moe_fast.down_{}[{n_ff}x45,2 tok]", fmt_name(fmt));
        emit(guard(&name, || check_down(gpu, rng, &name, fmt, n_ff)));
    }
    emit(guard("moe_fast.twins_decline", || Ok(check_declines())));
    for fmt in ExpertFormat::ALL {
        let name = format!("moe_fast.gate_up_q8k_{}[4096x512,2 tok]", fmt_name(fmt));
        emit(guard(&name, || check_gate_up_quantized(gpu, rng, &name, fmt)));
    }
    // The router's logits and selection in one launch: top-k with bias and hash layers, 1 and 3 tokens.
    let router_cases = [(false, 1usize), (true, 1), (false, 3)];
    let router_name = |(hash, n_tok)| {
        let kind = if hash { "hash" } else { "topk+bias" };
        format!("moe_fast.f16_router[{kind},{n_tok} tok]")
    };
    each(gpu, rng, emit, router_cases, router_name, check_router);
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
        "moe_fast.twins_decline",
        (cases.len() - declined) as f64,
        0.0,
        0.0,
        ok,
        format!("{declined}/{} declined", cases.len()),
    )
}
