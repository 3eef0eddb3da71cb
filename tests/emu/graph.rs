//! The HIP backend's captured decode graph and device sampling without a GPU (src/backend/hip/decode.rs):
//! the unmodified backend on the HIP runtime of kernels/emu/hip_api.cpp (which records stream
//! captures and replays them), every kernel executed by the CPU emulator, tiny synthetic model with a
//! 512-token vocabulary (window 16, ratios [0, 0, 4, 128, 4, 128], indexer top-k 4).
//!
//! (a) Decode steps replaying the graph give bit-identical logits to the same steps as direct
//!     launches, at every position across the ratio-4 compression boundaries (a row every 4 tokens),
//!     the indexer activation (more than top-k = 4 compressed rows from p = 19) and the 16-token
//!     window; also after a prefill, after `reset` and after `load_state` (the graph is captured once
//!     and replayed at every one of those positions).
//! (b) Device sampling through the backend: greedy equals the host argmax of the same logits, and
//!     the min-p path equals the host sampler for the same draw (the kernel-level comparison on many
//!     random vectors is in tests/hip_kernels/sample.rs).
//! (c) The capture rule the side lanes rely on: a fork to a second stream must be joined before
//!     the capture ends (the sessions above capture with their lanes on, the default).
//! Runs with `cargo test --release --features hip --test emu graph::`; skipped (with a message)
//! when there is no C++ compiler to build the emulator.
#![cfg(feature = "hip")]

use crate::hip_emu;

use std::cell::Cell;

use ds4_chat::backend::arithmetic::Arithmetic;
use ds4_chat::backend::hip::{HipOptions, HipSession};
use ds4_chat::backend::{DevicePick, DeviceSample, DeviceSession};
use ds4_chat::engine::events::SamplingParams;
use ds4_chat::engine::sampler::{Sampler, argmax};
use ds4_chat::genmodel::ExpertMix;
use hip_emu::{kernels_run_by, thread_counts};

/// Context of the sessions: past the indexer activation (p = 19) with room for the prefill case.
const CTX: usize = 40;

/// A session replaying the decode graph (`graph`) or launching directly, prefilling in chunks of 5.
fn backend(graph: bool) -> HipSession {
    let model = hip_emu::small_vocab_tiny(11, ExpertMix::Mixed);
    let options = HipOptions {
        prefill_chunk: 5,
        decode_graph: graph,
        ..HipOptions::default()
    };
    // Bitwise against the CPU engine: the exact contract.
    hip_emu::exact_backend(model, CTX, options)
}

fn ids(n: usize, seed: u64) -> Vec<u32> {
    (0..n as u64)
        .map(|i| ((i * 2654435761 + seed * 97) % 509) as u32)
        .collect()
}

/// Positions where two logit vectors differ in any bit.
fn bit_diffs(a: &[f32], b: &[f32]) -> usize {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count()
}

/// One decode step; returns the kernels the emulator ran for it.
fn step(b: &mut HipSession, t: u32) -> u64 {
    kernels_run_by(|| b.eval(&[t], &mut |_, _| true).expect("decode step")).1
}

#[test]
fn decode_graph_replay_is_bit_identical_to_direct_launches() {
    if hip_emu::use_emulated_hip().is_none() {
        return;
    }
    let t0 = std::time::Instant::now();
    let captures0 = thread_counts().captures;
    let (mut g, mut d) = (backend(true), backend(false));
    let toks = ids(21, 5);
    let mut steps = 0;
    // Kernels the emulator ran for each graph step (all the same: one replay per step, whose
    // first step captures and then replays) and for all direct steps.
    let per_replay = Cell::new(None);
    let direct = Cell::new(0);
    let mut check = |g: &mut HipSession, d: &mut HipSession, t: u32, what: &str| {
        let p = g.n_past();
        let replayed = step(g, t);
        let want = per_replay.get().unwrap_or(replayed);
        per_replay.set(Some(want));
        assert_eq!(
            replayed, want,
            "{what}: a graph step at position {p} ran another number of kernels"
        );
        direct.set(direct.get() + step(d, t));
        assert_eq!(
            bit_diffs(g.logits(), d.logits()),
            0,
            "{what}: graph replay and direct launches differ at position {p}"
        );
        steps += 1;
    };
    // Positions 0..20: compressed rows at p = 3, 7, ..., 19, the selection from p = 19 on.
    for &t in &toks {
        check(&mut g, &mut d, t, "decode");
    }
    // Only the graph session captured, once.
    assert_eq!(
        thread_counts().captures - captures0,
        1,
        "one capture for the graph session"
    );
    let (per_replay, direct) = (per_replay.get().expect("decode steps ran"), direct.get());
    // The direct launches leave out what exits at once (inactive indexer, one-split combine, no
    // emitted rows), so a replay runs at least as many launches as any direct step.
    assert!(
        per_replay * toks.len() as u64 >= direct && direct > 0,
        "graph {per_replay} launches per step, direct {direct} in {} steps",
        toks.len()
    );

    // A checkpoint, more steps, then back to the checkpoint: the same graph replays at the restored
    // positions.
    let saved = (g.save_state(), d.save_state());
    let (a, b) = (ids(1, 9), ids(2, 13));
    for &t in &a {
        check(&mut g, &mut d, t, "after a checkpoint");
    }
    g.load_state(&saved.0).expect("load graph backend state");
    d.load_state(&saved.1).expect("load direct backend state");
    assert_eq!(bit_diffs(g.logits(), d.logits()), 0, "restored logits");
    for &t in &b {
        check(&mut g, &mut d, t, "after load_state");
    }

    // Reset, a prefill of 12 tokens in chunks of 5 (direct launches on both), then decode steps
    // from p = 12 (one emits a compressed row at p = 15).
    g.reset();
    d.reset();
    for x in [&mut g, &mut d] {
        x.eval(&toks[..12], &mut |_, _| true).expect("prefill");
    }
    assert_eq!(bit_diffs(g.logits(), d.logits()), 0, "prefill logits");
    for &t in &toks[12..16] {
        check(&mut g, &mut d, t, "decode after reset and prefill");
    }
    assert_eq!(thread_counts().captures - captures0, 1, "captured once");
    eprintln!(
        "{steps} decode steps compared bitwise in {:.1}s; {per_replay} launches per graph replay, \
         {:.1} per direct step",
        t0.elapsed().as_secs_f64(),
        direct as f64 / toks.len() as f64
    );
}

/// In both arithmetic modes: the fast one runs the split greedy pick and the two-launch min-p draw
/// (kernels/sample_fast.hip) on the fast forward's logits.
#[test]
fn device_sampling_matches_the_host_sampler_on_the_backend() {
    if hip_emu::use_emulated_hip().is_none() {
        return;
    }
    device_sampling_matches_the_host_sampler(backend(true));
    let options = HipOptions {
        prefill_chunk: 5,
        arithmetic: Arithmetic::Fast,
        ..HipOptions::default()
    };
    let model = hip_emu::small_vocab_tiny(11, ExpertMix::Mixed);
    device_sampling_matches_the_host_sampler(hip_emu::emulated_backend(model, CTX, options));
}

fn device_sampling_matches_the_host_sampler(mut b: HipSession) {
    let params = SamplingParams {
        temperature: 0.9,
        top_p: 1.0,
        top_k: 0,
        min_p: 0.01,
        seed: None,
    };
    for (i, &t) in ids(6, 21).iter().enumerate() {
        step(&mut b, t);
        // Sample on the device first: the logits are then fetched afterwards, lazily.
        let greedy = b.sample_on_device(DeviceSample::Greedy).expect("hip samples").unwrap();
        let seed = 1000 + i as u64;
        let u01 = ds4_chat::engine::sampler::Xorshift64Star::new(seed).next_unit_f32();
        let min_p = DeviceSample::MinP {
            temperature: params.temperature,
            min_p: params.min_p,
            u01,
        };
        let pick = b.sample_on_device(min_p).expect("hip samples").unwrap();
        let logits = b.logits().to_vec();
        assert_eq!(
            greedy,
            DevicePick {
                token: argmax(&logits),
                drew: false
            }
        );
        let host = Sampler::new(Some(seed)).sample(&logits, &params);
        // The kernel sums in another order: a different pick is possible only when u01 falls within
        // float rounding of a boundary, checked exactly in tests/hip_kernels/sample.rs; 6 draws on these
        // logits are far from one (it would fail here, not pass silently).
        assert_eq!((pick.token, pick.drew), (host, true), "step {i}, u01 {u01}");
    }
}

/// The capture rule the side lanes rely on (src/backend/hip/lanes.rs), as the emulated runtime
/// enforces it: a stream that waits for an event recorded in a capture joins it, and ending the
/// capture fails with hipErrorStreamCaptureUnjoined (904) while the capturing stream has not waited
/// for all of the joined stream's work; once it has, the capture ends and both streams' work
/// replays.
#[test]
fn a_forked_capture_must_be_joined() {
    use ds4_chat::backend::hip::HipContext;
    use ds4_chat::backend::hip::kernels;
    if hip_emu::use_emulated_hip().is_none() {
        return;
    }
    let ctx = HipContext::new().expect("emulated HIP runtime");
    let module = ds4_chat::backend::hip::kernel_module::KernelModule::load(&ctx).expect("kernel module");
    let n = 64usize;
    let (a, b) = (ctx.alloc(n * 4).unwrap(), ctx.alloc(n * 4).unwrap());
    let (main, side) = (ctx.stream().unwrap(), ctx.stream().unwrap());
    let (fork, join) = (ctx.event(false).unwrap(), ctx.event(false).unwrap());
    let fill = |s: &ds4_chat::backend::hip::Stream, p: &ds4_chat::backend::hip::DeviceBuffer, v: f32| {
        // SAFETY: each buffer holds n floats, the length the launch is given.
        unsafe { module.launch(s, &kernels::fill_f32(p.ptr().0, n as u64, v), true) }.unwrap()
    };
    for joined in [false, true] {
        main.begin_capture(ds4_chat::backend::hip::CaptureMode::ThreadLocal)
            .unwrap();
        fill(&main, &a, 1.0);
        fork.record(&main).unwrap();
        side.wait_event(&fork).unwrap();
        fill(&side, &b, 2.0);
        if joined {
            join.record(&side).unwrap();
            main.wait_event(&join).unwrap();
        }
        match main.end_capture() {
            Err(e) => {
                assert!(!joined, "joined capture refused: {e}");
                assert_eq!(e.code, 904, "{e}");
            }
            Ok(g) => {
                assert!(joined, "an unjoined fork was accepted");
                g.instantiate().unwrap().launch(&main).unwrap();
                main.synchronize().unwrap();
                assert_eq!(a.to_vec::<f32>().unwrap(), vec![1.0; n]);
                assert_eq!(b.to_vec::<f32>().unwrap(), vec![2.0; n]);
            }
        }
        // After a refused capture the side stream is out of it: it runs work again.
        fill(&side, &b, 3.0);
        side.synchronize().unwrap();
        assert_eq!(b.to_vec::<f32>().unwrap(), vec![3.0; n]);
    }
}
