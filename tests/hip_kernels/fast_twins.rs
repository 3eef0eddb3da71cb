//! The fast-arithmetic twins (kernels/*_fast.hip, `kernels::fast_twin`) against their exact kernels
//! on the same random inputs: float outputs within FAST_TOL × max|exact| (a reordered sum of n
//! products differs by a few ulps of its largest partial sums, far below 1e-5 for these lengths);
//! quantized codes may differ only where the fast input sits within rounding of a code boundary,
//! so by at most one step, and the differing codes are counted; the greedy pick exactly.

use ds4_chat::backend::hip::kernels::{self, QuantOut};
use ds4_chat::backend::hip::runtime::DeviceBuffer;
use ds4_chat::gguf::half::f32_to_f16;

use super::matvec_fast::{check_q8_0, check_swiglu};
use super::support::*;

/// Every check of this file.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    // The Q8_0 matvec twins of the decode shapes (the checks of group `matvec_fast`).
    let q8_0_cases = [
        (4096usize, 1029usize, 1029usize, 2usize),
        (1024, 96, 24, 2),
        (7168, 77, 77, 1),
        (256, 40, 40, 3),
    ];
    let q8_0_name =
        |(n_in, n_out, group, n_tok)| format!("fast_twins.matvec_q8_0[{n_in}x{n_out},group {group},{n_tok} tok]");
    each(gpu, rng, emit, q8_0_cases, q8_0_name, check_q8_0);
    let swiglu_name = |(n_in, n_ff, _)| format!("fast_twins.matvec_q8_0_swiglu[{n_in}x{n_ff}]");
    let swiglu_cases = [(4096usize, 300usize, 1usize), (512, 33, 1)];
    each(gpu, rng, emit, swiglu_cases, swiglu_name, check_swiglu);
    let f16_cases = [
        (4096usize, 256usize, 1usize, false),
        (4096, 1030, 2, false),
        (72, 33, 3, false),
        (4096, 512, 1, true),
        (1024, 77, 2, true),
    ];
    let f16_name = |(n_in, n_out, n_tok, pair)| {
        let kind = if pair { "matvec_f16_pair" } else { "matvec_f16" };
        format!("fast_twins.{kind}[{n_in}x{n_out},{n_tok} tok]")
    };
    each(gpu, rng, emit, f16_cases, f16_name, check_matvec_f16);
    let argmax_name = |n| format!("fast_twins.argmax[{n}]");
    each(gpu, rng, emit, [129280usize, 1001, 3], argmax_name, check_argmax);
    let mix_name = |(n_in, n_mix, n_tok)| format!("fast_twins.hc_mix[{n_in}x{n_mix},{n_tok} tok]");
    each(
        gpu,
        rng,
        emit,
        [(16384usize, 4usize, 1usize), (1000, 3, 2)],
        mix_name,
        check_hc_mix,
    );
    let r = guard("fast_twins.hc_pre_fused.xn", || {
        check_hc_pre_fused(gpu, rng, &mut *emit)
    });
    emit(r);
}

fn check_matvec_f16(gpu: &Gpu, rng: &mut CheckRng, name: &str, shape: (usize, usize, usize, bool)) -> Checked {
    let (n_in, n_out, n_tok, pair) = shape;
    let mut case = F16ProjCase::new(gpu, rng, 2, (n_in, n_out, n_tok), n_in)?;
    let l = if pair {
        case.pair()
    } else {
        case.single(kernels::matvec_f16)
    };
    let n_outs = if pair { 2 } else { 1 };
    let mut outs: Vec<&mut DeviceBuffer> = case.ys.iter_mut().take(n_outs).collect();
    fast_within_tol(gpu, name, &l, &mut outs, format!("{n_tok} tokens"))
}

/// Random logits with NaN, -inf and a tie at the maximum (the first index must win), the tie's
/// second id in a later block of the fast pick's split. The fast pick runs twice on one buffer whose
/// counter starts at zero, as a decode session launches it (the last block puts the counter back).
fn check_argmax(gpu: &Gpu, rng: &mut CheckRng, name: &str, n: usize) -> Checked {
    let mut cases = Vec::new();
    let mut x = random_vec(rng, n, 8.0);
    if n > 10 {
        x[n / 3] = f32::NAN;
        x[n / 2] = f32::NEG_INFINITY;
        x[n - 1] = 100.0;
        x[n / 4 + 1] = 100.0;
    }
    cases.push(x);
    cases.push(vec![f32::NAN; n]);
    let mut last = vec![f32::NEG_INFINITY; n];
    last[n - 1] = -5.0;
    cases.push(last);
    let out = sample_buffer(gpu)?;
    let mut differ = 0;
    for logits in &cases {
        let l_d = gpu.up(logits)?;
        let l = kernels::argmax(out.ptr().0, l_d.ptr().0, n as u32);
        let fast = twin_of(&l);
        let mut picks = Vec::new();
        for launch in [&l, &fast, &fast] {
            gpu.run(launch)?;
            let w = out.to_vec::<u32>()?;
            picks.push([w[0], w[1], w[kernels::SAMPLE_COUNTER_WORD]]);
        }
        differ += picks[1..].iter().filter(|p| **p != picks[0]).count();
    }
    Ok(count_differ(
        name,
        differ,
        true,
        format!(
            "{} logit vectors (NaN, -inf, a tie at the maximum), twice each: {differ} fast picks differ from the exact (id, flag, counter back at 0)",
            cases.len()
        ),
    ))
}

/// The output head's HC mix (n_in = n_hc * n_embd, n_mix = n_hc) within FAST_TOL of the exact
/// kernel's sequential dot.
fn check_hc_mix(gpu: &Gpu, rng: &mut CheckRng, name: &str, (n_in, n_mix, n_tok): (usize, usize, usize)) -> Checked {
    let hc = gpu.up(&random_vec(rng, n_tok * n_in, 2.0))?;
    let fn_w: Vec<u16> = random_vec(rng, n_mix * n_in, 0.05)
        .iter()
        .map(|&v| f32_to_f16(v))
        .collect();
    let fn_d = gpu.up(&fn_w)?;
    let mut mix = gpu.poisoned::<f32>(n_tok * n_mix)?;
    let l = kernels::hc_mix(
        mix.ptr().0,
        hc.ptr().0,
        fn_d.ptr().0,
        n_in as u32,
        n_mix as u32,
        1e-6,
        n_tok as u32,
    );
    fast_within_tol(gpu, name, &l, &mut [&mut mix], format!("{n_tok} tok"))
}

/// The fused HC pre step: xn within FAST_TOL of the exact kernel's, the split within the HC split's
/// bound (hc_fast::SPLIT_TOL: the Sinkhorn passes carry the mix dots' reordering into every entry,
/// one policy with hc_fast's checks); the Q8_0 codes of xn at most one step apart (a fast xn
/// within rounding of a code boundary), the differing count reported. Launched twice on both
/// kernels (the counters reset), as the decode graph replays it.
fn check_hc_pre_fused(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) -> Checked {
    let case = super::hc::HcPreFused::new(gpu, rng)?;
    let (n_hc, n_embd, n_tok, iters) = (case.n_hc, case.n_embd, case.n_tok, case.iters);
    let mut split = gpu.poisoned::<f32>(n_tok * case.n_mix)?;
    let mut xn = gpu.poisoned::<f32>(n_tok * n_embd)?;
    let mut q0_q = gpu.poisoned::<i8>(n_tok * n_embd)?;
    let mut q0_d = gpu.poisoned::<f32>(n_tok * n_embd / q8_0_block())?;
    let o = QuantOut {
        out: xn.ptr().0,
        q8_0_q: q0_q.ptr().0,
        q8_0_d: q0_d.ptr().0,
        ..Default::default()
    };
    let l = case.launch(&split, o);
    let mut outs = [&mut split, &mut xn, &mut q0_q, &mut q0_d];
    let (a, f) = exact_and_fast(gpu, &l, &mut outs)?;
    // Again: the per-token counters were reset by the first launches.
    let (a2, f2) = exact_and_fast(gpu, &l, &mut outs)?;
    let repeat_ok = a == a2 && f == f2;
    emit(close_scaled(
        "fast_twins.hc_pre_fused.split",
        &f32s(&f[0]),
        &f32s(&a[0]),
        super::hc_fast::SPLIT_TOL,
        format!("{iters} Sinkhorn iterations; repeat launches identical: {repeat_ok}"),
    ));
    let (qa, qf) = (&a[2], &f[2]);
    let differ = qa.iter().zip(qf).filter(|(x, y)| x != y).count();
    let max_step = qa
        .iter()
        .zip(qf)
        .map(|(&x, &y)| (x as i8 as i32 - y as i8 as i32).abs())
        .max()
        .unwrap_or(0);
    emit(CheckResult::measured(
        "fast_twins.hc_pre_fused.q8_0",
        max_step as f64,
        differ as f64 / qa.len() as f64,
        1.0,
        max_step <= 1 && close_scaled("", &f32s(&f[3]), &f32s(&a[3]), FAST_TOL, String::new()).verdict == Verdict::Pass,
        format!(
            "{differ} of {} codes differ (by one step at most), scales within {FAST_TOL:e}",
            qa.len()
        ),
    ));
    let mut r = close_scaled(
        "fast_twins.hc_pre_fused.xn",
        &f32s(&f[1]),
        &f32s(&a[1]),
        FAST_TOL,
        format!("{n_tok} tok, n_hc {n_hc}, n_embd {n_embd}"),
    );
    if !repeat_ok {
        r.verdict = Verdict::Fail;
        r.note += "; a repeated launch gave other bits";
    }
    Ok(r)
}
