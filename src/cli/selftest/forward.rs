//! `selftest --backend hip --model FILE --forward N`: the device forward pass (`HipSession`) against
//! the CPU engine (`backend::cpu::CpuSession`) on the same model. In exact arithmetic the kernels
//! compute the CPU's float operations in its order, so every comparison is bitwise
//! (`backend::agreement`); in fast arithmetic the greedy continuation must pick the CPU's argmax up
//! to the CPU's first step whose top-2 margin is below 1 (`Agreement::greedy_prefix_verdict`, the
//! criterion for the tiny models; the teacher-forced positions' flips and |Δlogprob| figures are
//! reported), while the device's own repeats (checkpoint, reset, graph) stay bitwise.
//!
//! Both backends evaluate the same N pseudo-random tokens one by one, then continue greedily for G
//! tokens; every position's logits must be the CPU's bit for bit (and so the greedy tokens equal).
//! A checkpoint round trip (save, evaluate, load, evaluate again) and a reset must reproduce the
//! device's own logits exactly. Both then prefill the N tokens in one eval (the GPU's chunked
//! prefill) and decode up to 8 of the greedy tokens after it, compared the same way. Last, the
//! decode graph's replay against direct launches, and device sampling against the host sampler.
//!
//! It lives in the CLI, not in `backend::hip`, because it needs the engine's sampler (the top layer
//! may import every other, src/lib.rs).

use std::sync::Arc;
use std::time::Instant;

use crate::backend::agreement::{Agreement, compare_logits, top_k};
use crate::backend::arithmetic::Arithmetic;
use crate::backend::cpu::CpuSession;
use crate::backend::{DeviceSample, DeviceSession};
use crate::engine::events::SamplingParams;
use crate::engine::sampler::{Sampler, Xorshift64Star};
use crate::model::Model;

use crate::backend::hip::kernel_module::KernelModule;
use crate::backend::hip::options::HipOptions;
use crate::backend::hip::runtime::HipContext;
use crate::backend::hip::selftest::CheckRng;
use crate::backend::hip::session::HipSession;

fn argmax(x: &[f32]) -> u32 {
    top_k(x, 1)[0] as u32
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn status(ok: bool) -> &'static str {
    if ok { "PASS" } else { "FAIL" }
}

/// Run the check; `line` receives the report lines. Returns whether every comparison passed.
pub fn run_forward_check(
    model: Arc<Model>,
    n_prompt: usize,
    n_greedy: usize,
    seed: u64,
    arithmetic: Arithmetic,
    line: &mut dyn FnMut(String),
) -> Result<bool, String> {
    // The verdict on a run of positions (`greedy_from`: the first position whose logits pick a
    // greedy token, for fast arithmetic's check): whether it passed, and what the report line adds
    // after the summary (the greedy steps that agreed, or why it failed).
    let judge = |a: &Agreement, greedy_from: usize| -> (bool, String) {
        let verdict = match arithmetic {
            Arithmetic::Exact => a.verdict().map(|()| String::new()),
            // No minimum of equal greedy steps: on the random tiny models the CPU's margin often
            // falls below 1 at the first greedy step, so the count is reported, not required.
            Arithmetic::Fast => a.greedy_prefix_verdict(greedy_from, 0).map(|n| {
                let steps = a.positions.len().saturating_sub(greedy_from);
                format!("; greedy: {n} of {steps} steps equal before the CPU's first margin < 1")
            }),
        };
        match verdict {
            Ok(note) => (true, note),
            Err(e) => (false, format!(" ({e})")),
        }
    };
    let hp = &model.hp;
    let ctx = n_prompt + n_greedy + 8;
    let mut rng = CheckRng::new(seed);
    let tokens: Vec<u32> = (0..n_prompt)
        .map(|_| rng.int_in(0, hp.n_vocab as i64 - 1) as u32)
        .collect();
    let hip = HipContext::new().map_err(|e| e.to_string())?;
    let kernels = KernelModule::load(&hip)?;
    let unified = crate::backend::hip::open::unified_memory(&hip, &kernels.target);
    let t0 = Instant::now();
    let mut gpu = HipSession::new(
        hip,
        kernels,
        model.clone(),
        ctx,
        HipOptions {
            arithmetic,
            ..HipOptions::from_env(unified)?
        },
    )?;
    line(format!(
        "forward: HIP backend ready in {:.2} s (weights {:.1} MiB, kv {:.1} MiB); {n_prompt} prompt tokens, {n_greedy} greedy, ctx {ctx}, {} arithmetic",
        t0.elapsed().as_secs_f64(),
        gpu.memory().device_weight_bytes as f64 / (1 << 20) as f64,
        gpu.memory().kv_bytes as f64 / (1 << 20) as f64,
        arithmetic,
    ));
    let mut cpu = CpuSession::new(model.clone(), ctx, 0).map_err(|e| e.to_string())?;

    // The prompt as decode steps, then a greedy continuation on the CPU's argmax (the same as the
    // GPU's while the logits are equal).
    let mut decode = Agreement::default();
    let (mut gpu_s, mut cpu_s) = (0f64, 0f64);
    let mut greedy = Vec::new();
    let mut first_logits = Vec::new();
    for p in 0..n_prompt + n_greedy {
        let tok = match tokens.get(p) {
            Some(&t) => t,
            None => {
                greedy.push(argmax(cpu.logits()));
                greedy[greedy.len() - 1]
            }
        };
        let t = Instant::now();
        gpu.eval(&[tok], &mut |_, _| true)
            .map_err(|e| format!("HIP eval at {p}: {e}"))?;
        gpu_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        cpu.eval(&[tok], &mut |_, _| true)
            .map_err(|e| format!("CPU eval at {p}: {e}"))?;
        cpu_s += t.elapsed().as_secs_f64();
        if p == 0 {
            first_logits = gpu.logits().to_vec();
        }
        decode.push(compare_logits(gpu.logits(), cpu.logits()));
    }
    // The logits after the last prompt token pick the first greedy token.
    let decode_greedy = n_prompt.saturating_sub(1);
    let (decode_ok, decode_note) = judge(&decode, decode_greedy);
    let n = (n_prompt + n_greedy).max(1) as f64;
    line(format!(
        "{} forward.decode         {n_prompt} prompt + {n_greedy} greedy steps: {}{decode_note}; decode {:.1} ms/token GPU, {:.1} ms/token CPU",
        status(decode_ok),
        decode.summary(),
        1e3 * gpu_s / n,
        1e3 * cpu_s / n,
    ));
    line(format!("forward: greedy {:?}", &greedy[..greedy.len().min(24)]));

    // Checkpoint round trip on the device (save_state / load_state): the same kernels on the same
    // restored state give the same logits, bit for bit.
    let probe: Vec<u32> = tokens.iter().take(3).copied().collect();
    let state = gpu.save_state();
    let mut first = Vec::new();
    for &t in &probe {
        gpu.eval(&[t], &mut |_, _| true)
            .map_err(|e| format!("HIP eval after save: {e}"))?;
        first.push(gpu.logits().to_vec());
    }
    gpu.load_state(&state).map_err(|e| format!("HIP load_state: {e}"))?;
    let mut state_ok = true;
    for (&t, want) in probe.iter().zip(&first) {
        gpu.eval(&[t], &mut |_, _| true)
            .map_err(|e| format!("HIP eval after load: {e}"))?;
        state_ok &= same_bits(gpu.logits(), want);
    }
    line(format!(
        "{} forward.checkpoint     save {:.1} MiB, {} tokens, load, the same tokens again: {}",
        status(state_ok),
        state.len() as f64 / (1u64 << 20) as f64,
        probe.len(),
        if state_ok { "bitwise equal" } else { "logits differ" }
    ));

    // Reset brings the device cache back to an empty state: the first token gives the same logits.
    gpu.reset();
    gpu.eval(&tokens[..1], &mut |_, _| true).map_err(|e| e.to_string())?;
    let reset_ok = same_bits(gpu.logits(), &first_logits) && gpu.n_past() == 1;
    line(format!(
        "{} forward.reset          the first token again after a reset: {}, n_past {}",
        status(reset_ok),
        if same_bits(gpu.logits(), &first_logits) {
            "bitwise equal"
        } else {
            "logits differ"
        },
        gpu.n_past()
    ));

    // Prefill: the prompt in one eval on both (the GPU in chunks of batched GEMMs; the CPU in its
    // layer-major chunks), then the greedy tokens as decode steps on both.
    gpu.reset();
    cpu.reset();
    let t = Instant::now();
    gpu.eval(&tokens, &mut |_, _| true)
        .map_err(|e| format!("HIP prefill: {e}"))?;
    let gpu_prefill_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    cpu.eval(&tokens, &mut |_, _| true)
        .map_err(|e| format!("CPU prefill: {e}"))?;
    let cpu_prefill_s = t.elapsed().as_secs_f64();
    let mut prefill = Agreement::default();
    prefill.push(compare_logits(gpu.logits(), cpu.logits()));
    for (step, &tok) in greedy.iter().take(8).enumerate() {
        gpu.eval(&[tok], &mut |_, _| true)
            .map_err(|e| format!("HIP decode after prefill ({step}): {e}"))?;
        cpu.eval(&[tok], &mut |_, _| true)
            .map_err(|e| format!("CPU decode after prefill ({step}): {e}"))?;
        prefill.push(compare_logits(gpu.logits(), cpu.logits()));
    }
    // Every position after the prefill picks (or, the last, would pick) a greedy token.
    let (prefill_ok, prefill_note) = judge(&prefill, 0);
    line(format!(
        "{} forward.prefill        {n_prompt} tokens in one eval, then {} decode steps: {}{prefill_note}; prefill {:.1} ms ({:.0} tokens/s) GPU, {:.1} ms CPU",
        status(prefill_ok),
        prefill.positions.len() - 1,
        prefill.summary(),
        1e3 * gpu_prefill_s,
        n_prompt as f64 / gpu_prefill_s.max(1e-9),
        1e3 * cpu_prefill_s,
    ));
    let graph_ok = check_decode_graph(&mut gpu, &tokens, &greedy, line)?;
    Ok(decode_ok && state_ok && reset_ok && prefill_ok && graph_ok)
}

/// The prompt and the greedy tokens as decode steps, replaying the captured decode graph and then as
/// direct launches from a reset: every step's logits bit-identical (the same kernels on the same
/// data; only where the position comes from differs). On the graph pass, device sampling against
/// the host sampler on the same logits: greedy exactly; min-p for a fixed draw, where a different
/// pick is possible only when the draw falls within float rounding of a cumulative boundary (the
/// emulator test excuses those exactly; here they are counted and reported, not failed).
fn check_decode_graph(
    gpu: &mut HipSession,
    tokens: &[u32],
    greedy: &[u32],
    line: &mut dyn FnMut(String),
) -> Result<bool, String> {
    let steps: Vec<u32> = tokens.iter().chain(greedy).copied().collect();
    let params = SamplingParams {
        temperature: 0.8,
        top_p: 1.0,
        top_k: 0,
        min_p: 0.02,
        seed: None,
    };
    let mut graph_logits = Vec::with_capacity(steps.len());
    let (mut greedy_bad, mut min_p_differ) = (0usize, 0usize);
    let mut timing = [0f64; 2];
    let mut launches = [0u64; 2];
    let mut differ = Vec::new();
    // The graph pass records its logits; the direct pass compares against them.
    for (pass, graph) in [true, false].into_iter().enumerate() {
        gpu.reset();
        gpu.set_decode_graph(graph);
        let l0 = gpu.launch_count();
        for (p, &tok) in steps.iter().enumerate() {
            let t = Instant::now();
            gpu.eval(&[tok], &mut |_, _| true)
                .map_err(|e| format!("HIP eval at {p} (graph {graph}): {e}"))?;
            timing[pass] += t.elapsed().as_secs_f64();
            if !graph {
                let want: &Vec<f32> = &graph_logits[p];
                if gpu.logits().iter().zip(want).any(|(a, b)| a.to_bits() != b.to_bits()) {
                    differ.push(p);
                }
                continue;
            }
            let seed = 7 + p as u64;
            let u01 = Xorshift64Star::new(seed).next_unit_f32();
            let dev = |gpu: &mut HipSession, how| match gpu.sample_on_device(how) {
                Some(r) => r.map_err(|e| format!("device sampling at {p}: {e}")),
                None => Err("the HIP backend has no device sampling".to_string()),
            };
            let g = dev(gpu, DeviceSample::Greedy)?;
            let m = dev(
                gpu,
                DeviceSample::MinP {
                    temperature: params.temperature,
                    min_p: params.min_p,
                    u01,
                },
            )?;
            let logits = gpu.logits().to_vec();
            greedy_bad += usize::from(g.token != crate::engine::sampler::argmax(&logits) || g.drew);
            min_p_differ += usize::from(m.token != Sampler::new(Some(seed)).sample(&logits, &params) || !m.drew);
            graph_logits.push(logits);
        }
        launches[pass] = gpu.launch_count() - l0;
    }
    gpu.set_decode_graph(true);
    let n = steps.len().max(1) as f64;
    let ok = differ.is_empty() && greedy_bad == 0;
    line(format!(
        "{} forward.graph          {} decode steps replaying the graph vs direct launches: {}; {:.2} ms/token graph ({:.0} launches/step), {:.2} ms/token direct ({:.1} launches/step)",
        if differ.is_empty() { "PASS" } else { "FAIL" },
        steps.len(),
        if differ.is_empty() {
            "bitwise equal".to_string()
        } else {
            format!("differ at positions {:?}", &differ[..differ.len().min(12)])
        },
        1e3 * timing[0] / n,
        launches[0] as f64 / n,
        1e3 * timing[1] / n,
        launches[1] as f64 / n,
    ));
    line(format!(
        "{} forward.device_sample  greedy: {} of {} steps differ from the host argmax (must be 0); min-p (T 0.8, min_p 0.02): {} differ from the host sampler (only draws within float rounding of a boundary may)",
        if greedy_bad == 0 { "PASS" } else { "FAIL" },
        greedy_bad,
        steps.len(),
        min_p_differ,
    ));
    Ok(ok)
}
