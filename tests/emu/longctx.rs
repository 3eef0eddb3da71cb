//! A long context on the emulator, past the bounds of the tiny model that decode touches every
//! step (16-row window, ratio-4 rows with the indexer choosing 4 of 11) and close to the session's
//! cap (hip_emu_prefill crosses the first ratio-128 row): chunked prefill then decode against decode steps only and against the CPU engine, exact
//! arithmetic, bit for bit; and a checkpoint taken there restored into a session with another
//! prefill chunk (so another ring length) continues with the same bits, from a payload about half
//! the size of the f32 cache it restores. About 3 minutes of one core.
//! Runs with `cargo test --release --features hip --test emu longctx::`; skipped (with a message)
//! when there is no C++ compiler to build the emulator.
#![cfg(feature = "hip")]

use crate::hip_emu;

use std::sync::{Arc, OnceLock};

use ds4_chat::backend::DeviceSession;
use ds4_chat::backend::cpu::CpuSession;
use ds4_chat::backend::hip::{HipOptions, HipSession};
use ds4_chat::genmodel::ExpertMix;
use ds4_chat::model::Model;

/// The session's context: the prompt and the decoded tail end 4 tokens short of it.
const CTX: usize = 52;
const PROMPT: usize = 44;
const TAIL: usize = 4;

fn model() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| hip_emu::small_vocab_tiny(17, ExpertMix::Q2)).clone()
}

fn gpu(prefill_chunk: usize) -> HipSession {
    let options = HipOptions {
        prefill_chunk,
        ..HipOptions::default()
    };
    hip_emu::exact_backend(model(), CTX, options)
}

/// Deterministic token ids (LCG) inside the vocabulary.
fn ids(n: usize, seed: u64) -> Vec<u32> {
    hip_emu::lcg_ids(n, seed, model().hp.n_vocab as u64)
}

/// The logits after the prompt (evaluated by `feed`) and after each tail token, as bits.
fn run(b: &mut dyn DeviceSession, prompt: &[u32], tail: &[u32], feed: usize) -> Vec<Vec<u32>> {
    for part in prompt.chunks(feed) {
        b.eval(part, &mut |_, _| true).expect("prompt");
    }
    let mut out = vec![bits(b.logits())];
    for &t in tail {
        b.eval(&[t], &mut |_, _| true).expect("tail token");
        out.push(bits(b.logits()));
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn assert_same(what: &str, a: &[Vec<u32>], b: &[Vec<u32>]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let differ = x.iter().zip(y).filter(|(p, q)| p != q).count();
        assert_eq!(differ, 0, "{what}: {differ} logits differ after eval {i}");
    }
}

#[test]
fn long_context_prefill_decode_and_checkpoint_agree_bitwise() {
    if hip_emu::use_emulated_hip().is_none() {
        return;
    }
    let hp = &model().hp;
    assert!(PROMPT > 2 * hp.sliding_window && PROMPT / 4 > 2 * hp.idx_top_k);
    let toks = ids(PROMPT + TAIL, 23);
    let (prompt, tail) = toks.split_at(PROMPT);

    // Prefill in 16-token chunks (the last one partial), the prompt handed over in 20-token evals.
    let mut chunked = gpu(16);
    let want = run(&mut chunked, prompt, tail, 20);
    let mut steps = gpu(1);
    assert_same(
        "decode steps only vs chunked prefill",
        &run(&mut steps, prompt, tail, 1),
        &want,
    );
    let mut cpu = CpuSession::new(model(), CTX, 1).unwrap();
    assert_same("CPU engine vs chunked prefill", &run(&mut cpu, prompt, tail, 64), &want);

    // Checkpoint after the prompt, restored into a session with 8-token chunks (a 23-row ring
    // instead of 31); saving a session restored with the same chunk gives the payload back.
    let mut a = gpu(16);
    a.eval(prompt, &mut |_, _| true).unwrap();
    let state = a.save_state();
    let mut other = gpu(8);
    other
        .load_state(&state)
        .expect("restore into a session with another chunk");
    assert_eq!(other.n_past(), PROMPT);
    assert_same("restored into another session", &run(&mut other, &[], tail, 1), &want);
    let mut same = gpu(16);
    same.load_state(&state).unwrap();
    assert!(same.save_state() == state, "save(load(x)) != x");

    // The payload: the window's ring rows and the live compressed rows in f16, states f32, next
    // to the logits; the f32 rows alone would take twice the rows' bytes.
    let f32_rows: usize = (0..hp.n_layer)
        .map(|l| {
            let r = hp.ratio(l) as usize;
            let live = PROMPT.checked_div(r).unwrap_or(0);
            let index = if hp.has_indexer(l) { live * hp.idx_head_dim } else { 0 };
            let comp = live * hp.head_dim;
            4 * (hp.sliding_window * hp.head_dim + comp + index)
        })
        .sum();
    let logits = 4 * hp.n_vocab;
    let states: usize = (0..hp.n_layer)
        .filter(|&l| hp.ratio(l) != 0)
        .map(|l| {
            let (r, c) = (hp.ratio(l) as usize, hp.compress_overlap(l));
            let idx = if hp.has_indexer(l) { hp.idx_head_dim } else { 0 };
            2 * 4 * c * r * c * (hp.head_dim + idx)
        })
        .sum();
    let overhead = state.len() - logits - states - f32_rows / 2;
    assert!(
        overhead < 4096,
        "payload {} bytes: {overhead} past the f16 rows, states and logits",
        state.len()
    );
}
