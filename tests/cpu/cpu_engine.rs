//! CPU engine properties the reference vectors cannot see (tests/fixtures/vectors/README.md, "What these
//! vectors cannot see") and the session-level contracts: prefill = decode, checkpoint round trip,
//! cancellation, context limit. Runs on the case-A model (see tests/common).

use super::small_model::ids;
use crate::common;

use std::sync::Arc;

use ds4_chat::backend::cpu::cache::Rows;
use ds4_chat::backend::cpu::ops::{E2M1_VALUES, e4m3_value};
use ds4_chat::backend::cpu::{CpuModel, CpuSession};
use ds4_chat::backend::{BackendError, DeviceModel, DeviceSession};
use ds4_chat::gguf::half::round_f16;

fn decode_all(b: &mut CpuSession, toks: &[u32]) {
    for &t in toks {
        b.eval(&[t], &mut |_, _| true).unwrap();
    }
}

fn is_e4m3_code(v: f32) -> bool {
    let a = v.abs();
    (0..=126).any(|i| e4m3_value(i) == a)
}

/// A 64-block is E4M3 values times one power-of-two scale.
fn e4m3_block_ok(blk: &[f32]) -> bool {
    if blk.iter().all(|&v| v == 0.0) {
        return true;
    }
    (-60..=20).any(|k| {
        let s = 2f32.powi(k);
        blk.iter().all(|&v| (v / s).abs() <= 448.0 && is_e4m3_code(v / s))
    })
}

/// A 32-block is E2M1 values times one power-of-two scale.
fn fp4_block_ok(blk: &[f32]) -> bool {
    (-130..=20).any(|k| {
        let s = 2f32.powi(k);
        blk.iter().all(|&v| E2M1_VALUES.contains(&(v / s).abs()))
    })
}

fn all_f16(rows: &Rows) -> bool {
    rows.live().iter().all(|&v| round_f16(v) == v)
}

/// 140 tokens cross the 32-row window, the first ratio-4 emission (p = 3), the indexer threshold
/// (more than top-k = 8 compressed rows from p = 35) and the first ratio-128 emission (p = 127), and
/// span two prefill chunks (128 + 12).
///
/// Prefill and decode must give *bit-identical* logits here, not merely close ones: the engine runs
/// decode as a one-token chunk of the same layer-major code, every token has its own activation
/// quantization, and a batch only shares weight reads, so no float operation differs. (ds4 itself
/// differs between its paths by quantization ties; our tolerance is zero by construction.)
#[test]
fn prefill_equals_decode_checkpoints_resume_and_cache_formats() {
    let Some(model) = common::model() else { return };
    let hp = model.hp.clone();
    let ctx = 512;
    let toks = ids(140, 42, hp.n_vocab);

    let mut pre = CpuSession::new(model.clone(), ctx, 0).unwrap();
    let mut calls = Vec::new();
    pre.eval(&toks, &mut |d, t| {
        calls.push((d, t));
        true
    })
    .unwrap();
    assert_eq!(calls.first(), Some(&(128, 140)), "progress after the first chunk");
    assert_eq!(pre.n_past(), 140);

    // Token-by-token decode, checkpoint at 131 (not a multiple of 4 or 128).
    let mut dec = CpuSession::new(model.clone(), ctx, 1).unwrap();
    decode_all(&mut dec, &toks[..131]);
    let state = dec.save_state();
    let mut resumed = CpuSession::new(model.clone(), ctx, 2).unwrap();
    resumed.load_state(&state).unwrap();
    assert_eq!(resumed.n_past(), 131);
    assert_eq!(resumed.logits(), dec.logits());
    assert_eq!(resumed.save_state(), state, "save(load(x)) == x");
    decode_all(&mut dec, &toks[131..]);
    decode_all(&mut resumed, &toks[131..]);
    assert_eq!(
        resumed.logits(),
        dec.logits(),
        "a restored backend continues bit-identically"
    );
    let max_diff = pre
        .logits()
        .iter()
        .zip(dec.logits())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    println!("prefill vs decode over 140 tokens: max |Δlogit| = {max_diff}");
    assert_eq!(
        pre.logits(),
        dec.logits(),
        "prefill and decode logits differ (max {max_diff})"
    );

    // Cancel after the first chunk: the cache is consistent at `done` and continues exactly.
    let mut can = CpuSession::new(model.clone(), ctx, 0).unwrap();
    let err = can.eval(&toks, &mut |_, _| false).unwrap_err();
    assert_eq!(err, BackendError::Cancelled { done: 128 });
    assert_eq!(can.n_past(), 128);
    can.eval(&toks[128..], &mut |_, _| true).unwrap();
    assert_eq!(can.logits(), pre.logits());

    // Cache contents (docs/model.md#fp8-and-fp4-simulations, #kv-cache), on the prefilled backend.
    let caches = pre.caches();
    for (l, c) in caches.iter().enumerate() {
        let raw = &c.raw.rows;
        assert_eq!(raw.n, hp.sliding_window.min(140), "layer {l} raw rows");
        assert!(all_f16(raw), "layer {l}: raw rows not f16-representable");
        for row in raw.live().chunks_exact(hp.head_dim) {
            for blk in row[..hp.head_dim_nope()].chunks_exact(64) {
                assert!(
                    e4m3_block_ok(blk),
                    "layer {l}: raw row block is not E4M3 × 2^k: {blk:?}"
                );
            }
        }
        if let Some((rows, _)) = &c.comp {
            assert_eq!(rows.n, 140 / c.ratio, "layer {l} compressed rows");
            assert!(all_f16(rows), "layer {l}: compressed rows not f16-representable");
            for row in rows.live().chunks_exact(hp.head_dim) {
                for blk in row[..hp.head_dim_nope()].chunks_exact(64) {
                    assert!(e4m3_block_ok(blk), "layer {l}: compressed row block is not E4M3 × 2^k");
                }
            }
        }
        if let Some((rows, _)) = &c.index {
            assert_eq!(rows.n, 140 / 4, "layer {l} indexer rows");
            assert!(all_f16(rows), "layer {l}: indexer rows not f16-representable");
            for blk in rows.live().chunks_exact(32) {
                assert!(
                    fp4_block_ok(blk),
                    "layer {l}: indexer row block is not FP4 × 2^k: {blk:?}"
                );
            }
        }
    }
    // A random row is not E4M3-structured, so the check above can fail.
    let noise: Vec<f32> = (0..64).map(|i| 0.1 + i as f32 * 0.0123457).collect();
    assert!(!e4m3_block_ok(&noise));
    assert!(!fp4_block_ok(&noise[..32]));
}

#[test]
fn context_limit_and_bad_checkpoints_are_errors() {
    let Some(model) = common::model() else { return };
    let mut b = CpuSession::new(model.clone(), 16, 1).unwrap();
    // No token may sit at a position ≥ ctx.
    let toks = ids(17, 7, model.hp.n_vocab);
    assert_eq!(
        b.eval(&toks, &mut |_, _| true),
        Err(BackendError::ContextFull { needed: 17, ctx: 16 })
    );
    assert_eq!(b.n_past(), 0);
    assert!(matches!(
        b.eval(&[model.hp.n_vocab as u32], &mut |_, _| true),
        Err(BackendError::Other(_))
    ));
    b.eval(&toks[..15], &mut |_, _| true).unwrap();
    assert!(matches!(
        b.eval(&toks[..2], &mut |_, _| true),
        Err(BackendError::ContextFull { .. })
    ));

    let state = b.save_state();
    let mut small = CpuSession::new(model.clone(), 8, 1).unwrap();
    assert!(matches!(small.load_state(&state), Err(BackendError::BadCheckpoint(_))));
    let mut other = CpuSession::new(model.clone(), 16, 1).unwrap();
    assert!(matches!(
        other.load_state(&state[..state.len() - 4]),
        Err(BackendError::BadCheckpoint(_))
    ));
    let mut bad_magic = state.clone();
    bad_magic[0] ^= 1;
    assert!(matches!(
        other.load_state(&bad_magic),
        Err(BackendError::BadCheckpoint(_))
    ));
    assert_eq!(other.n_past(), 0, "a rejected payload leaves the state alone");
    other.load_state(&state).unwrap();
    assert_eq!(other.n_past(), 15);
    // The 16th token still fits (position 15 < ctx).
    other.eval(&toks[15..16], &mut |_, _| true).unwrap();
    assert_eq!(other.n_past(), 16);
    other.reset();
    assert_eq!(other.n_past(), 0);
}

/// PromptCache: prefix reuse, checkpoint restore after an edit, rewind; every state compared bit-for-bit
/// with a fresh backend that evaluated the same tokens (the engine is deterministic).
#[test]
fn session_reuses_prefixes_and_restores_checkpoints() {
    use ds4_chat::engine::prompt_cache::{PromptCache, SyncReport};
    let Some(model) = common::model() else { return };
    let ctx = 256;
    let v = model.hp.n_vocab;
    let fresh = |toks: &[u32]| -> Vec<f32> {
        let mut b = CpuSession::new(model.clone(), ctx, 0).unwrap();
        b.eval(toks, &mut |_, _| true).unwrap();
        b.logits().to_vec()
    };
    let mut s = PromptCache::new(Box::new(CpuSession::new(model.clone(), ctx, 0).unwrap()), 3);
    let p1 = ids(40, 1, v);
    let r = s.sync(&p1, &mut |_, _| true).unwrap();
    assert_eq!(
        r,
        SyncReport {
            reused: 0,
            evaluated: 40,
            restored: false
        }
    );
    assert_eq!(s.logits(), fresh(&p1).as_slice());

    // Generation, then the next turn extends prompt + reply: only the new suffix is evaluated.
    let reply = ids(3, 2, v);
    for &t in &reply {
        s.decode(t).unwrap();
    }
    let p2: Vec<u32> = p1.iter().chain(&reply).chain(&ids(10, 3, v)).copied().collect();
    let r = s.sync(&p2, &mut |_, _| true).unwrap();
    assert_eq!(
        r,
        SyncReport {
            reused: 43,
            evaluated: 10,
            restored: false
        }
    );
    assert_eq!(s.tokens(), p2.as_slice());
    assert_eq!(s.logits(), fresh(&p2).as_slice());

    // An edited turn: live tokens are not a prefix, the checkpoint at the end of p1 is.
    let p3: Vec<u32> = p1.iter().chain(&ids(5, 4, v)).copied().collect();
    let r = s.sync(&p3, &mut |_, _| true).unwrap();
    assert_eq!(
        r,
        SyncReport {
            reused: 40,
            evaluated: 5,
            restored: true
        }
    );
    assert_eq!(s.logits(), fresh(&p3).as_slice());

    // Rewind below every checkpoint: rebuilt from scratch.
    s.rewind(20, &mut |_, _| true).unwrap();
    assert_eq!(s.tokens(), &p1[..20]);
    assert_eq!(s.logits(), fresh(&p1[..20]).as_slice());
    // Rewind onto a checkpoint boundary after re-extending: restored without evaluation.
    s.sync(&p2, &mut |_, _| true).unwrap();
    s.rewind(40, &mut |_, _| true).unwrap();
    assert_eq!(s.logits(), fresh(&p1).as_slice());

    // Cancelled sync: tokens() says what the cache holds.
    let long = ids(200, 5, v);
    let err = s.sync(&long, &mut |_, _| false).unwrap_err();
    assert_eq!(err, BackendError::Cancelled { done: 128 });
    assert_eq!(s.tokens(), &long[..128]);
    assert!(matches!(
        s.sync(&ids(ctx, 6, v), &mut |_, _| true),
        Err(BackendError::ContextFull { .. })
    ));
}

/// Generic dimensions: a second synthetic model with other widths (E 512, 8 heads of 256, 4 groups,
/// 3 of 8 experts, window 16, indexer 2 heads / top-4, 7 Sinkhorn iterations, 2 hash layers) made by
/// tools/gen_tiny_gguf.py from tests/data/tiny_b_config.json (`DS4_TINY_B=path` uses another file).
/// Checks the pass runs, stays finite and prefill = decode.
#[test]
fn other_dimensions_run_and_prefill_equals_decode() {
    let Some(path) = common::tiny_b_path() else { return };
    let model = std::sync::Arc::new(ds4_chat::model::weights::Model::open(std::path::Path::new(&path)).unwrap());
    let toks = ids(140, 9, model.hp.n_vocab);
    let mut pre = CpuSession::new(model.clone(), 300, 0).unwrap();
    pre.eval(&toks, &mut |_, _| true).unwrap();
    assert!(pre.logits().iter().all(|v| v.is_finite()));
    let mut dec = CpuSession::new(model.clone(), 300, 0).unwrap();
    decode_all(&mut dec, &toks);
    assert_eq!(pre.logits(), dec.logits());
    let state = dec.save_state();
    let mut r = CpuSession::new(model, 300, 0).unwrap();
    r.load_state(&state).unwrap();
    assert_eq!(r.save_state(), state);
}

/// Sessions of one `CpuModel` share its model and start empty: a second session with another
/// context, opened while the first holds tokens, gives bitwise the logits of a backend made from
/// scratch, and so does the first.
#[test]
fn engine_sessions_share_the_model_and_keep_their_own_caches() {
    use ds4_chat::genmodel::{ExpertMix, tiny_model};
    use ds4_chat::model::Model;
    let model = Arc::new(Model::bind(tiny_model(7, ExpertMix::Q2).unwrap()).unwrap());
    let engine = CpuModel::new(model.clone(), 1).unwrap();
    let toks = ids(6, 3, model.hp.n_vocab);
    let mut first = engine.session(16).unwrap();
    decode_all(&mut first, &toks);
    let mut second = engine.open_session(32).unwrap();
    assert_eq!((second.ctx(), second.n_past()), (32, 0));
    assert!(Arc::ptr_eq(engine.model(), &model) && Arc::ptr_eq(first.model(), &model));
    second.eval(&toks, &mut |_, _| true).unwrap();
    let mut fresh = CpuSession::new(model.clone(), 32, 1).unwrap();
    decode_all(&mut fresh, &toks);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(second.logits()), bits(fresh.logits()));
    assert_eq!(bits(first.logits()), bits(fresh.logits()));
    assert!(matches!(engine.session(1), Err(BackendError::Other(m)) if m.contains("too small")));
}
