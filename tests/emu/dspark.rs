//! DSpark on the HIP backend (src/backend/hip/session/dspark.rs, docs/dspark.md#on-the-hip-backend)
//! on the kernel emulator in exact arithmetic: the target rows captured on the device and read back
//! give the drafter exactly the rows the CPU session captures, so its proposals and confidences are
//! the CPU drafter's bit for bit (through prefill, verified blocks, rollbacks and a dropped block);
//! and greedy decoding with the drafter equals plain decoding token for token. In fast arithmetic
//! every confidence is the CPU drafter's within the fast tolerance on log-probabilities
//! (`FAST_TOLERANCES.max_abs`, here on its log-odds), and the proposals are the CPU drafter's
//! wherever its margin is clear.
//! Runs with `cargo test --release --features hip --test emu dspark::`.
#![cfg(feature = "hip")]

use std::sync::Arc;

use ds4_chat::backend::arithmetic::Arithmetic;
use ds4_chat::backend::cpu::CpuModel;
use ds4_chat::backend::cpu::dspark::CAPTURE_ROWS;
use ds4_chat::backend::dspark::DsparkForward;
use ds4_chat::backend::hip::{HipOptions, HipSession};
use ds4_chat::backend::{DeviceModel, DeviceSession};
use ds4_chat::engine::speculate::dspark::DsparkSettings;
use ds4_chat::model::Model;
use ds4_chat::model::dspark::DsparkConvention;

use crate::dspark_common::{bind, oracle_support, prompts, support_bytes, with_dspark};
use crate::hip_emu;
use crate::small_model::{ids, three_layer_model};
use crate::speculative_common::{CTX, budget, params, plain};
use crate::support::FAST_TOLERANCES;

/// Tokens generated per prompt on the emulator (about a second a forward pass).
const EMU_GEN: usize = 32;

/// 64-token prefill chunks (the prompts are one chunk, as on the CPU); every batch of more than one
/// token on the GEMMs (`matvec_tokens` 1: a verified block costs the emulator far less than on the
/// token-wise kernels, and is bitwise a decode's in exact arithmetic, tests/emu/prefill.rs).
fn gpu_options() -> HipOptions {
    HipOptions {
        prefill_chunk: 64,
        matvec_tokens: 1,
        ..HipOptions::default()
    }
}

/// An exact session of `gpu_options`.
fn gpu(model: &Arc<Model>) -> Box<dyn DeviceSession> {
    let b: HipSession = hip_emu::exact_backend(model.clone(), CTX, gpu_options());
    Box::new(b)
}

/// The first index of the largest value.
fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Draft from the same anchors on both sessions over cycles that keep a whole block, roll back to
/// the anchor, drop a whole block, and keep part of one (the first `cycles` of these): every
/// confidence and token of every row must be the same bits on the HIP session as on the CPU
/// session. Tolerance zero: the exact kernels give the CPU's HC states bitwise, and the host takes
/// the same mean of them. Returns the confidences compared.
fn same_proposals(
    model: &Arc<Model>,
    hip_options: HipOptions,
    convention: DsparkConvention,
    prompt: &[u32],
    cycles: usize,
) -> Vec<f32> {
    let support = bind(model, support_bytes(model));
    let mut cpu = CpuModel::new(model.clone(), 2).unwrap().open_session(CTX).unwrap();
    let mut hip: Box<dyn DeviceSession> = Box::new(hip_emu::exact_backend(model.clone(), CTX, hip_options));
    let mut on_cpu = cpu.dspark(support.clone(), convention).unwrap();
    let mut on_hip = hip.dspark(support, convention).unwrap();
    let b = on_cpu.block_size();
    assert_eq!(on_hip.block_size(), b);
    cpu.eval(prompt, &mut |_, _| true).unwrap();
    hip.eval(prompt, &mut |_, _| true).unwrap();
    let mut anchor = argmax(cpu.logits());
    let mut confidences = Vec::new();
    for keep in [b + 1, 1, 0, 3, b + 1].into_iter().take(cycles) {
        let pos = cpu.n_past();
        assert_eq!(hip.n_past(), pos);
        assert_eq!(argmax(hip.logits()), anchor, "{convention:?} at {pos}");
        assert!(on_cpu.run_block(anchor, pos).unwrap());
        assert!(on_hip.run_block(anchor, pos).unwrap());
        let mut block = vec![anchor];
        for row in 0..b {
            let prev = block[row];
            let (c, h) = (on_cpu.confidence(row, prev), on_hip.confidence(row, prev));
            assert_eq!(
                c.to_bits(),
                h.to_bits(),
                "{convention:?} at {pos}, row {row}: {c} vs {h}"
            );
            let t = on_cpu.token(row, prev);
            assert_eq!(on_hip.token(row, prev), t, "{convention:?} at {pos}, row {row}");
            block.push(t);
            confidences.push(c);
        }
        assert_eq!(on_hip.reads(), on_cpu.reads());
        cpu.verify(&block).unwrap();
        hip.verify(&block).unwrap();
        cpu.commit(keep).unwrap();
        hip.commit(keep).unwrap();
        anchor = argmax(cpu.logits());
    }
    assert_eq!(confidences.len(), cycles * b);
    confidences
}

/// The drafter's proposals on the HIP session are the CPU session's bit for bit through prefill,
/// verified blocks, rollbacks and a dropped block, in both conventions (the prompt is one batch on
/// both backends, so ds4's batch window is the same too).
#[test]
fn hip_drafter_proposes_the_cpu_drafters_bits() {
    if hip_emu::use_emulated_hip().is_none() {
        return;
    }
    let model = three_layer_model();
    let prompt = ids(30, 4, 512);
    // Every cycle kind under the reference convention; ds4's through the dropped block.
    for (convention, cycles) in [(DsparkConvention::Reference, 5), (DsparkConvention::Ds4, 3)] {
        let confidences = same_proposals(&model, gpu_options(), convention, &prompt, cycles);
        // The confidences compared are not one saturated value.
        let open = confidences.iter().filter(|c| **c > 0.0 && **c < 1.0).count();
        let first = confidences[0];
        assert!(open > 0 && confidences.iter().any(|&c| c != first), "{confidences:?}");
    }
}

/// A prefill chunk longer than the rows the capture keeps (`CAPTURE_ROWS`): the device copies its
/// last rows only, and the reference window over them is the CPU's (which ran the prompt in
/// chunks of its own size).
#[test]
fn hip_drafter_after_a_chunk_longer_than_the_capture() {
    if hip_emu::use_emulated_hip().is_none() {
        return;
    }
    let model = three_layer_model();
    let prompt = ids(CAPTURE_ROWS + 4, 9, 512);
    let options = HipOptions {
        prefill_chunk: CTX,
        ..gpu_options()
    };
    same_proposals(&model, options, DsparkConvention::Reference, &prompt, 1);
}

/// Greedy decoding with the drafter on the HIP session equals plain decoding for `EMU_GEN` tokens on
/// two prompts, one under each convention, drafting whole blocks (confidence 0: the most verifies
/// and rollbacks; the cut itself is the engine's, tests/cpu/dspark_drafter.rs). The plain tokens come from the CPU
/// engine: exact HIP decoding is its bitwise twin (tests/emu/forward.rs), and the emulator's time
/// goes to the speculative runs.
#[test]
fn greedy_dspark_on_the_emulator_equals_plain_decode() {
    if hip_emu::use_emulated_hip().is_none() {
        return;
    }
    let model = three_layer_model();
    let cpu_model = CpuModel::new(model.clone(), 2).unwrap();
    let cpu = || cpu_model.open_session(CTX).unwrap();
    let prompts = &prompts()[..2];
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| plain(&cpu, p, &params(0.0, 1), budget(EMU_GEN)).0)
        .collect();
    let support = oracle_support(&model, &want, 1000.0);
    let runs = [(DsparkConvention::Reference, 0.0), (DsparkConvention::Ds4, 0.0)];
    let open = || gpu(&model);
    for (i, (prompt, (convention, confidence))) in prompts.iter().zip(runs).enumerate() {
        let settings = DsparkSettings {
            path: None,
            confidence,
            convention,
        };
        let (got, f, n_past) = with_dspark(&open, prompt, &support, &settings, budget(EMU_GEN), Some(5));
        assert_eq!(got, want[i], "prompt {i}, {convention:?}, confidence {confidence}");
        assert_eq!(n_past, prompt.len() + EMU_GEN);
        eprintln!("prompt {i}, {convention:?}, confidence {confidence}: {f:?}");
        assert!(f.drafted > 0 && f.accepted > 0, "the drafter was idle: {f:?}");
        assert!(f.accepted < f.drafted, "no draft was rejected: {f:?}");
    }
}

/// In fast arithmetic the captured rows are the fast forward's, within its tolerances of the
/// exact ones, and the drafter (on the host, exact) must still propose the CPU drafter's token
/// wherever the CPU's top logit (LM head plus Markov bias) leads the runner-up by more than 1: a
/// margin the fast forward's error cannot close on the tiny model. The blocks are the CPU's
/// proposals, so both sessions verify the same tokens; cycles as in the exact test.
#[test]
fn fast_hip_drafter_proposes_the_cpu_drafters_tokens_where_the_margin_is_clear() {
    if hip_emu::use_emulated_hip().is_none() {
        return;
    }
    let model = three_layer_model();
    let cpu_model = CpuModel::new(model.clone(), 2).unwrap();
    let support = bind(&model, support_bytes(&model));
    let prompt = ids(30, 4, 512);
    let convention = DsparkConvention::Reference;
    let mut cpu = cpu_model.session(CTX).unwrap();
    // The batch kernels a session takes by default (token-wise up to `MATVEC_MAX_TOKENS`: the
    // prompt and every verified block), not the GEMMs `gpu_options` forces: with every batch on
    // the fast GEMMs (matrix-core twins) the captured rows move further, and one of 25 rows, at a
    // margin of 1.11, proposed another token.
    let options = HipOptions {
        arithmetic: Arithmetic::Fast,
        matvec_tokens: HipOptions::default().matvec_tokens,
        ..gpu_options()
    };
    let mut hip: Box<dyn DeviceSession> = Box::new(hip_emu::emulated_backend(model.clone(), CTX, options));
    assert_eq!(hip.arithmetic(), Some(Arithmetic::Fast));
    let mut on_cpu = cpu.dspark_cpu(support.clone(), convention);
    let mut on_hip = hip.dspark(support.clone(), convention).unwrap();
    let b = on_cpu.block_size();
    cpu.eval(&prompt, &mut |_, _| true).unwrap();
    hip.eval(&prompt, &mut |_, _| true).unwrap();
    let mut anchor = argmax(cpu.logits());
    let (mut clear, mut rows, mut worst) = (0, 0, 0.0f32);
    for keep in [b + 1, 1, 0, 3, b + 1] {
        let pos = cpu.n_past();
        assert!(on_cpu.run_block(anchor, pos).unwrap());
        assert!(on_hip.run_block(anchor, pos).unwrap());
        let mut block = vec![anchor];
        for row in 0..b {
            let prev = block[row];
            let bias = on_cpu.markov_bias(prev).to_vec();
            let mut logits: Vec<f32> = on_cpu.base_logits(row).iter().zip(&bias).map(|(l, m)| l + m).collect();
            let t = on_cpu.token(row, prev);
            assert_eq!(argmax(&logits), t);
            let top = logits[t as usize];
            logits[t as usize] = f32::NEG_INFINITY;
            let margin = top - logits[argmax(&logits) as usize];
            let (c_cpu, c_hip) = (on_cpu.confidence(row, prev), on_hip.confidence(row, prev));
            // Clamped so that two saturated confidences compare as equal, not as inf − inf.
            let log_odds = |c: f32| {
                let c = c.clamp(1e-6, 1.0 - 1e-6);
                (c / (1.0 - c)).ln()
            };
            let d = (log_odds(c_hip) - log_odds(c_cpu)).abs();
            assert!(
                d <= FAST_TOLERANCES.max_abs as f32,
                "at {pos}, row {row}: confidence {c_hip} against the CPU's {c_cpu} ({d} in log-odds)"
            );
            worst = worst.max(d);
            let h = on_hip.token(row, prev);
            if margin > 1.0 {
                assert_eq!(h, t, "at {pos}, row {row}: margin {margin}");
                clear += 1;
            }
            rows += 1;
            block.push(t);
        }
        cpu.verify(&block).unwrap();
        hip.verify(&block).unwrap();
        cpu.commit(keep).unwrap();
        hip.commit(keep).unwrap();
        anchor = argmax(cpu.logits());
    }
    eprintln!(
        "fast: every draft row's confidence within {worst} of the CPU's in log-odds; {clear} of {rows} rows had a \
         token margin over 1 and were compared"
    );
    assert!(clear > 0, "no row had a margin over 1");
}
