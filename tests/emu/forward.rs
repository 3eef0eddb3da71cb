//! The HIP backend end to end without a GPU: `HipSession` (runtime layer, kernel module, the decode
//! step's launch order, every kernel executed by the CPU emulator, tests/hip_emu) against the CPU
//! engine on small-vocabulary tiny models with q2, q4 and mixed experts.
//!
//! The comparison is bitwise: the kernels follow the CPU engine's operation order. So a session's
//! cache carried through the KV snapshot file format resumes on the other backend bitwise too
//! (docs/sessions.md#kv-snapshots).
#![cfg(feature = "hip")]

use crate::hip_emu;
use crate::sessions_common;

use ds4_chat::backend::agreement::{Agreement, compare_logits};
use ds4_chat::backend::arithmetic::Arithmetic;
use ds4_chat::engine::events::BackendChoice;
use ds4_chat::genmodel::ExpertMix;
use sessions_common::{carry, continue_both, cpu_session, tokens};

fn check(experts: ExpertMix, seed: u64, n: usize) {
    let model = hip_emu::small_vocab_tiny(seed, experts);
    let ctx = n + 8;
    let mut gpu = hip_emu::open_copied(&model, BackendChoice::Hip, Arithmetic::Exact, ctx).session;
    assert_eq!(gpu.name(), "hip");
    let mut cpu = cpu_session(&model, ctx);
    // A fixed pseudo-random sequence over the 512-token vocabulary.
    let tokens: Vec<u32> = (0..n as u64)
        .map(|i| ((i * 2654435761 + seed * 97) % 509) as u32)
        .collect();
    let t0 = std::time::Instant::now();
    let mut agreement = Agreement::default();
    let mut differ = Vec::new();
    for (p, &t) in tokens.iter().enumerate() {
        gpu.eval(&[t], &mut |_, _| true).unwrap();
        cpu.eval(&[t], &mut |_, _| true).unwrap();
        agreement.push(compare_logits(gpu.logits(), cpu.logits()));
        if gpu
            .logits()
            .iter()
            .zip(cpu.logits())
            .any(|(a, b)| a.to_bits() != b.to_bits())
        {
            differ.push(p);
        }
    }
    eprintln!(
        "{} experts, seed {seed}: {n} decode steps in {:.1}s; logits bitwise equal to the CPU's at {} of {n} positions; {}",
        experts.name(),
        t0.elapsed().as_secs_f64(),
        n - differ.len(),
        agreement.summary()
    );
    let by_position: Vec<String> = agreement
        .positions
        .iter()
        .map(|d| format!("{:.3}", d.max_logprob))
        .collect();
    eprintln!("  by position: {}", by_position.join(" "));
    // The kernels reproduce the CPU engine's operation order (kernels/prelude.h "arithmetic
    // contract"), so every position's logits must be the CPU's to the bit.
    assert!(
        differ.is_empty(),
        "{} experts: logits differ from the CPU engine's at positions {differ:?} ({})",
        experts.name(),
        agreement.summary()
    );
}

/// 32 positions: past the 16-token window, eight ratio-4 rows (indexer selection from position 19 on,
/// top-k 4), and the ratio-128 compressor state filling.
#[test]
fn hip_decode_matches_the_cpu_engine_on_the_emulator() {
    if hip_emu::use_emulated_hip().is_none() {
        return;
    }
    for (experts, seed) in [(ExpertMix::Q2, 7), (ExpertMix::Q4, 3), (ExpertMix::Mixed, 5)] {
        check(experts, seed, 32);
    }
}

/// 18 tokens held (past the 16-token window, four ratio-4 rows, the ratio-128 state), then 2 more.
/// The engines are opened once; each case opens fresh sessions on them.
#[test]
fn a_session_saved_on_one_backend_resumes_bitwise_on_the_other() {
    if hip_emu::use_emulated_hip().is_none() {
        return;
    }
    let model = hip_emu::small_vocab_tiny(2, ExpertMix::Q2);
    let all = tokens(20, 4, model.hp.n_vocab);
    let (held, then) = all.split_at(18);
    let ctx = 32;
    let engine = |choice| hip_emu::open_copied(&model, choice, Arithmetic::Exact, ctx).model;
    let (cpu, hip) = (engine(BackendChoice::Cpu), engine(BackendChoice::Hip));
    assert_eq!((cpu.name(), hip.name()), ("cpu", "hip"));
    for (from, to) in [(&cpu, &hip), (&hip, &cpu), (&hip, &hip)] {
        let what = format!("{} to {}", from.name(), to.name());
        let mut saved = from.open_session(ctx).unwrap();
        saved.eval(held, &mut |_, _| true).unwrap();
        let mut resumed = to.open_session(ctx).unwrap();
        carry(&model, saved.as_ref(), held, resumed.as_mut());
        // The uninterrupted session continues on the backend the cache was saved on; the two
        // backends compute the same bits, so the resumed one must match it exactly.
        continue_both(resumed.as_mut(), saved.as_mut(), then, &what);
    }
}
