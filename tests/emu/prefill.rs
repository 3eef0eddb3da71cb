//! The HIP backend's chunked prefill (src/backend/hip/prefill.rs) without a GPU: the unmodified
//! backend runs on the HIP runtime of kernels/emu/hip_api.cpp (tools/build-hip-emu.sh), every kernel
//! executed by the CPU emulator. Checks, on a tiny synthetic model with a 512-token vocabulary:
//! (a) prefill of N tokens vs the same N tokens as decode steps on the same backend (logits after
//!     the last token, the next decode steps, and the device cache: raw ring, compressed rows and
//!     indexer rows of every layer);
//! (b) the GPU prefill vs the CPU engine's prefill;
//! (c) chunk boundaries: several chunks, a prefill starting at n_past > 0, positions across the
//!     16-row window, the ratio-4 rows, the indexer selection (more than 4 rows from p = 19) and the
//!     first ratio-128 row (p = 127).
//! Runs with `cargo test --release --features hip --test emu prefill::`; skipped (with a message)
//! when there is no C++ compiler to build the emulator.
#![cfg(feature = "hip")]

use crate::hip_emu;

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use ds4_chat::backend::agreement::{Agreement, LogitDiff, compare_logits};
use ds4_chat::backend::cpu::CpuSession;
use ds4_chat::backend::hip::{HipOptions, HipSession};
use ds4_chat::backend::{BackendError, DeviceSession};
use ds4_chat::genmodel::ExpertMix;
use ds4_chat::model::Model;
use hip_emu::{LayerCacheView, hip_cache, kernels_run_by};

/// The tiny preset (6 layers, ratios [0, 0, 4, 128, 4, 128], window 16, top-k 4) cut to 512 tokens.
fn model() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| hip_emu::small_vocab_tiny(7, ExpertMix::Q2)).clone()
}

/// A HipSession on the emulator with `prefill_chunk` tokens per chunk and batches of up to
/// `matvec_tokens` on the token-wise kernels (made directly: the tests choose both).
fn gpu(ctx: usize, prefill_chunk: usize, matvec_tokens: usize) -> HipSession {
    // Bitwise checks: the exact kernels (the fast GEMMs have their own tolerance checks).
    let options = HipOptions {
        prefill_chunk,
        matvec_tokens,
        ..HipOptions::default()
    };
    hip_emu::exact_backend(model(), ctx, options)
}

/// Deterministic token ids (LCG) inside the vocabulary.
fn ids(n: usize, seed: u64) -> Vec<u32> {
    hip_emu::lcg_ids(n, seed, model().hp.n_vocab as u64)
}

/// On the emulated HIP runtime (tests/hip_emu): `prompt_len` deterministic tokens and the 2 decoded
/// after them. `None` (reason printed) without a C++ compiler.
fn emulated_prompt(prompt_len: usize, seed: u64) -> Option<(Vec<u32>, Vec<u32>)> {
    hip_emu::use_emulated_hip()?;
    let mut prompt = ids(prompt_len + 2, seed);
    let tail = prompt.split_off(prompt_len);
    Some((prompt, tail))
}

fn eval(b: &mut dyn DeviceSession, toks: &[u32]) {
    b.eval(toks, &mut |_, _| true).expect("eval");
}

/// Elementwise comparison of two equally long float arrays.
#[derive(Debug, Default, Clone, Copy)]
struct Diff {
    n: usize,
    /// Elements that are not bit-identical.
    differ: usize,
    max_abs: f32,
    mean_abs: f64,
}

fn diff(a: &[f32], b: &[f32]) -> Diff {
    assert_eq!(a.len(), b.len(), "compared arrays differ in length");
    let mut d = Diff {
        n: a.len(),
        ..Default::default()
    };
    for (&x, &y) in a.iter().zip(b) {
        if x.to_bits() != y.to_bits() {
            d.differ += 1;
        }
        let e = (x - y).abs();
        d.max_abs = d.max_abs.max(if e.is_nan() { f32::INFINITY } else { e });
        d.mean_abs += e as f64;
    }
    d.mean_abs /= d.n.max(1) as f64;
    d
}

/// Every layer's cache of two backends (raw window, compressed rows, indexer rows, and the
/// compressor states when `with_state`) merged into one comparison per kind.
fn cache_diff(a: &[LayerCacheView], b: &[LayerCacheView], with_state: bool) -> [Diff; 4] {
    let mut out = [Diff::default(); 4];
    for (x, y) in a.iter().zip(b) {
        let kinds = [
            (&x.raw, &y.raw),
            (&x.comp, &y.comp),
            (&x.index, &y.index),
            (&x.state, &y.state),
        ];
        for (k, (u, v)) in kinds.into_iter().enumerate() {
            if k == 3 && !with_state {
                continue;
            }
            let d = diff(u, v);
            let o = &mut out[k];
            o.mean_abs = (o.mean_abs * o.n as f64 + d.mean_abs * d.n as f64) / (o.n + d.n).max(1) as f64;
            o.n += d.n;
            o.differ += d.differ;
            o.max_abs = o.max_abs.max(d.max_abs);
        }
    }
    out
}

/// The CPU engine's cache in the same layout.
fn cpu_cache(c: &CpuSession) -> Vec<LayerCacheView> {
    c.caches()
        .iter()
        .map(|lc| LayerCacheView {
            raw: lc.raw.rows.live().to_vec(),
            comp: lc.comp.as_ref().map(|(r, _)| r.live().to_vec()).unwrap_or_default(),
            index: lc.index.as_ref().map(|(r, _)| r.live().to_vec()).unwrap_or_default(),
            state: Vec::new(),
        })
        .collect()
}

fn report(what: &str, d: &LogitDiff) {
    eprintln!(
        "{what}: max|dlogit| {:.3e}, max|dlogprob| top20 {:.3e}, argmax {}, reference top-2 margin {:.3}",
        d.max_logit,
        d.max_logprob,
        if d.same_argmax { "same" } else { "DIFFERS" },
        d.ref_margin
    );
}

/// The logits of two evaluations are the same bits.
fn assert_same_logits(what: &str, a: &[f32], b: &[f32]) {
    let d = diff(a, b);
    assert_eq!(
        d.differ, 0,
        "{what}: {} of {} logits differ (max {:.3e})",
        d.differ, d.n, d.max_abs
    );
}

/// Every cache kind of two backends is the same bits.
fn assert_same_cache(what: &str, a: &[LayerCacheView], b: &[LayerCacheView], with_state: bool) {
    let kinds = cache_diff(a, b, with_state);
    for (name, d) in ["raw", "comp", "index", "state"].iter().zip(kinds) {
        eprintln!(
            "cache {what}, {name}: {} of {} floats differ, max {:.3e}, mean {:.3e}",
            d.differ, d.n, d.max_abs, d.mean_abs
        );
        assert_eq!(d.differ, 0, "cache {what}, {name}: not bitwise equal");
    }
}

/// (a) + (c) on the device: 22 tokens as decode steps vs the same tokens as a 3-token prefill, a
/// prefill from n_past = 3 in chunks of 8 (cancelled after its first chunk), prefills 11..16 and
/// 16..20, then 2 decode steps on both; the CPU engine evaluates the same tokens as the reference
/// of the noise level. Positions 0..21 cross the 16-row window, ratio-4 emissions (every 4th
/// token) and the indexer selection (more than top-k = 4 rows from p = 19).
///
/// Exactness: every kernel follows the CPU engine's operation order (kernels/prelude.h "arithmetic
/// contract"), the GEMMs as well as the decode matvecs, so the prefill, the decode and the CPU engine
/// give the same bits: logits after each eval and every cache row (raw ring, compressed and indexer
/// rows, compressor states) are compared for bitwise equality.
#[test]
fn device_prefill_matches_device_decode() {
    let Some((prompt, tail)) = emulated_prompt(20, 11) else {
        return;
    };
    let ends = [3usize, 11, 16, 20];
    // Decode: one token per eval; logits kept at the prefill's eval ends.
    let t0 = Instant::now();
    let mut dec = gpu(64, 1, HipOptions::default().matvec_tokens);
    let mut dec_logits = Vec::new();
    let mut dec_launches = 0;
    for (p, &t) in prompt.iter().enumerate() {
        dec_launches += kernels_run_by(|| eval(&mut dec, &[t])).1;
        if ends.contains(&(p + 1)) {
            dec_logits.push(dec.logits().to_vec());
        }
    }
    let t_dec = t0.elapsed().as_secs_f64();
    let dec_cache = hip_cache(&dec, &model().hp);
    let mut cpu = CpuSession::new(model(), 64, 0).unwrap();
    let mut cpu_logits = Vec::new();
    let mut from = 0;
    for &e in &ends {
        eval(&mut cpu, &prompt[from..e]);
        cpu_logits.push(cpu.logits().to_vec());
        from = e;
    }
    // Prefill: 3 tokens from 0; from 3 in chunks of 8, cancelled after the first chunk; then 11..16, 16..20.
    let t0 = Instant::now();
    // Batches this small would take the token-wise decode kernels (prefill::MATVEC_MAX_TOKENS); this
    // test is about the GEMMs and grouped experts, so every n > 1 takes them here.
    let mut pre = gpu(64, 8, 1);
    let mut pre_logits = Vec::new();
    eval(&mut pre, &prompt[..3]);
    pre_logits.push(pre.logits().to_vec());
    match pre.eval(&prompt[3..], &mut |done, _| done == 0) {
        Err(BackendError::Cancelled { done: 8 }) => {}
        other => panic!("expected Cancelled {{ done: 8 }}, got {other:?}"),
    }
    assert_eq!(pre.n_past(), 11, "a cancelled prefill keeps the chunks it finished");
    pre_logits.push(pre.logits().to_vec());
    let chunk_launches = kernels_run_by(|| eval(&mut pre, &prompt[11..16])).1;
    pre_logits.push(pre.logits().to_vec());
    eval(&mut pre, &prompt[16..]);
    pre_logits.push(pre.logits().to_vec());
    assert_eq!(pre.n_past(), 20);
    let t_pre = t0.elapsed().as_secs_f64();
    let pre_cache = hip_cache(&pre, &model().hp);
    let (mut vs_dec, mut vs_cpu) = (Agreement::default(), Agreement::default());
    for (i, &e) in ends.iter().enumerate() {
        let d = compare_logits(&pre_logits[i], &dec_logits[i]);
        report(&format!("prefill vs decode at position {}", e - 1), &d);
        vs_dec.push(d);
        vs_cpu.push(compare_logits(&pre_logits[i], &cpu_logits[i]));
        assert_same_logits(
            &format!("prefill vs decode at {}", e - 1),
            &pre_logits[i],
            &dec_logits[i],
        );
        assert_same_logits(&format!("prefill vs CPU at {}", e - 1), &pre_logits[i], &cpu_logits[i]);
    }
    assert_same_cache("prefill vs decode", &pre_cache, &dec_cache, true);
    assert_same_cache("decode vs CPU", &dec_cache, &cpu_cache(&cpu), false);
    // The next decode steps read the cache the prefill wrote.
    for &t in &tail {
        eval(&mut dec, &[t]);
        eval(&mut pre, &[t]);
        vs_dec.push(compare_logits(pre.logits(), dec.logits()));
        assert_same_logits(
            "decode after prefill vs decode after decode",
            pre.logits(),
            dec.logits(),
        );
    }
    eprintln!(
        "timing (emulator): {} decode steps {t_dec:.1} s ({:.2} s/token); the same tokens as prefills {t_pre:.1} s ({:.2} s/token)",
        prompt.len(),
        t_dec / prompt.len() as f64,
        t_pre / prompt.len() as f64
    );
    eprintln!(
        "launches: {:.0} per decode step, {chunk_launches} for a 5-token chunk at 11..16 (tiny model, 6 layers)",
        dec_launches as f64 / prompt.len() as f64
    );
    eprintln!("prefill vs decode: {}", vs_dec.summary());
    eprintln!("prefill vs CPU: {}", vs_cpu.summary());
}

/// (b) + (c) against the CPU engine over 138 positions: the GPU prefills in chunks of 24 from 0
/// (0..10), then from n_past 10, 40, 64 and 100 (10..40 = 24 + 6, 40..64 = 24, 64..100 = 24 + 12,
/// 100..136 = 24 + 12 with the first ratio-128 row emitted at p = 127 inside the second chunk), the
/// CPU in its own 128-token chunks; logits compared after each eval and after 2 decode steps, and
/// the caches compared, all bitwise.
#[test]
fn device_prefill_matches_the_cpu_engine() {
    let Some((prompt, tail)) = emulated_prompt(136, 5) else {
        return;
    };
    // Chunks of 24 take the GEMMs; the last one (16 tokens) the token-wise kernels.
    let mut g = gpu(160, 24, 16);
    let mut c = CpuSession::new(model(), 160, 0).unwrap();
    let mut agreement = Agreement::default();
    let t0 = Instant::now();
    let mut from = 0;
    for end in [10, 40, 64, 100, 136] {
        eval(&mut g, &prompt[from..end]);
        eval(&mut c, &prompt[from..end]);
        let d = compare_logits(g.logits(), c.logits());
        report(&format!("GPU vs CPU after prefill {from}..{end}"), &d);
        agreement.push(d);
        assert_same_logits(
            &format!("GPU vs CPU after prefill {from}..{end}"),
            g.logits(),
            c.logits(),
        );
        from = end;
    }
    let t_pre = t0.elapsed().as_secs_f64();
    assert_same_cache("GPU vs CPU", &hip_cache(&g, &model().hp), &cpu_cache(&c), false);
    for &t in &tail {
        eval(&mut g, &[t]);
        eval(&mut c, &[t]);
        agreement.push(compare_logits(g.logits(), c.logits()));
        assert_same_logits("GPU vs CPU decode after prefill", g.logits(), c.logits());
    }
    eprintln!("timing (emulator, GPU + CPU): prefill of 136 in 5 evals {t_pre:.1} s");
    eprintln!("GPU prefill vs CPU: {}", agreement.summary());
}
