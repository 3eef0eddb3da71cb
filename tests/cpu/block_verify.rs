//! The CPU engine's block verify and commit (docs/model.md#block-verify-and-commit), against plain
//! decode: a verified block's logits are bitwise those of decoding its tokens one by one, and a commit
//! of any prefix leaves the session's whole state (checkpoint bytes: tokens, logits, raw window,
//! compressed and indexer rows, both compressor states) bitwise that of a session that only ever
//! decoded the kept tokens. Tolerance zero: a verify is the decode arithmetic, and an undo copies
//! saved floats back.
//!
//! Model: the tiny architecture cut to a 512-token vocabulary and three layers (uncompressed, ratio
//! 4 with the indexer, ratio 128), generated in memory, so every kind of cache is present.

use std::sync::Arc;

use ds4_chat::backend::cpu::{CpuModel, CpuSession};
use ds4_chat::backend::{BackendError, DeviceModel, DeviceSession};
use ds4_chat::model::Model;

use super::small_model::{ids, three_layer_model};

/// Block length of the rollback cases (the 2–8 drafts).
const BLOCK: usize = 8;

fn model() -> Arc<Model> {
    three_layer_model()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A session that decoded `toks` one token at a time: its checkpoint bytes and logits after every
/// prefix (index p = after `toks[..p]`).
struct Reference {
    states: Vec<Vec<u8>>,
    logits: Vec<Vec<u32>>,
}

fn decode_reference(engine: &CpuModel, ctx: usize, toks: &[u32]) -> Reference {
    let mut s = engine.open_session(ctx).unwrap();
    let mut r = Reference {
        states: vec![s.save_state()],
        logits: vec![bits(s.logits())],
    };
    for &t in toks {
        s.eval(&[t], &mut |_, _| true).unwrap();
        r.states.push(s.save_state());
        r.logits.push(bits(s.logits()));
    }
    r
}

/// Row i of the last verify's block logits.
fn block_row(s: &dyn DeviceSession, i: usize, n_vocab: usize) -> Vec<u32> {
    bits(&s.block_logits()[i * n_vocab..(i + 1) * n_vocab])
}

/// One model, one decode reference over a context just past the last boundary the cases need.
struct Setup {
    engine: CpuModel,
    ctx: usize,
    toks: Vec<u32>,
    reference: Reference,
    n_vocab: usize,
}

fn setup() -> Setup {
    let model = model();
    let hp = model.hp.clone();
    // The boundaries below are derived from these; the case positions assume the cut schedule.
    assert_eq!(hp.compress_ratios, vec![0, 4, 128]);
    let ctx = 128 + BLOCK / 2 + 2;
    let toks = ids(ctx - 1, 17, hp.n_vocab);
    let engine = CpuModel::new(model, 0).unwrap();
    let reference = decode_reference(&engine, ctx, &toks);
    Setup {
        engine,
        ctx,
        toks,
        reference,
        n_vocab: hp.n_vocab,
    }
}

/// (a) Blocks of 1..=8 tokens at several positions: row i of the block logits is bitwise the
/// logits after decoding `toks[..=p0 + i]`, `logits()` is the last row, and a commit of the whole
/// block is the decoded state.
#[test]
fn block_logits_equal_sequential_decode_bitwise() {
    let s = setup();
    let mut session = s.engine.open_session(s.ctx).unwrap();
    let mut rows = 0;
    for n in 1..=BLOCK {
        let p0 = 9 * n;
        session.load_state(&s.reference.states[p0]).unwrap();
        session.verify(&s.toks[p0..p0 + n]).unwrap();
        assert_eq!(session.block_logits().len(), n * s.n_vocab);
        assert_eq!(session.n_past(), p0 + n);
        for i in 0..n {
            assert_eq!(
                block_row(session.as_ref(), i, s.n_vocab),
                s.reference.logits[p0 + i + 1],
                "block of {n} at {p0}: row {i} differs from decode"
            );
            rows += 1;
        }
        assert_eq!(bits(session.logits()), s.reference.logits[p0 + n]);
        session.commit(n).unwrap();
        assert_eq!(session.save_state(), s.reference.states[p0 + n], "block of {n} at {p0}");
    }
    assert_eq!(rows, BLOCK * (BLOCK + 1) / 2);
}

/// (b) Forced rejections at every offset of blocks that cross each boundary: after `commit(keep)`
/// the checkpoint bytes and exported cache equal those of the session that decoded only the kept
/// tokens, and the next decode (of a token the block did not propose there) gives bitwise the same
/// logits and state.
#[test]
fn commit_rolls_back_every_rejected_suffix_across_cache_boundaries() {
    let s = setup();
    let hp = s.engine.model().hp.clone();
    let window = hp.sliding_window.min(s.ctx);
    // The first position whose indexer sees more than top-k compressed rows (one per 4 tokens), so
    // the selection changes from "everything visible" to the top-k of the scores.
    let first_selection = 4 * (hp.idx_top_k + 1) - 1;
    let ratio_128_emission = 127;
    let placements = [
        ("raw window edge", window - BLOCK / 2),
        ("indexer selection start", first_selection + 1 - BLOCK / 2),
        ("ratio-128 emission", ratio_128_emission + 1 - BLOCK / 2),
    ];
    // The premise of the indexer placement: up to `first_selection` the ratio-4 layer (1) holds
    // top-k indexer rows, after it one more, so its selection starts inside that block.
    let mut probe = s.engine.session(s.ctx).unwrap();
    let index_rows = |probe: &CpuSession| probe.caches()[1].index.as_ref().map(|(rows, _)| rows.n);
    probe.load_state(&s.reference.states[first_selection]).unwrap();
    assert_eq!(index_rows(&probe), Some(hp.idx_top_k));
    probe.load_state(&s.reference.states[first_selection + 1]).unwrap();
    assert_eq!(index_rows(&probe), Some(hp.idx_top_k + 1));
    let mut session = s.engine.open_session(s.ctx).unwrap();
    let mut fresh = s.engine.open_session(s.ctx).unwrap();
    let mut cases = 0;
    for (what, p0) in placements {
        let block = &s.toks[p0..p0 + BLOCK];
        // Each block holds a ratio-4 emission and its boundary, strictly inside.
        let inside = |p: usize| p0 < p && p + 1 < p0 + BLOCK;
        match what {
            "raw window edge" => assert!(inside(window), "{what}: {p0}"),
            "indexer selection start" => assert!(inside(first_selection), "{what}: {p0}"),
            _ => assert!(inside(ratio_128_emission), "{what}: {p0}"),
        }
        assert!((p0..p0 + BLOCK).any(|p| (p + 1) % 4 == 0));
        for keep in 0..=BLOCK {
            session.load_state(&s.reference.states[p0]).unwrap();
            session.verify(block).unwrap();
            session.commit(keep).unwrap();
            let at = format!("{what}: block at {p0}, keep {keep}");
            assert_eq!(session.n_past(), p0 + keep, "{at}");
            assert_eq!(bits(session.logits()), s.reference.logits[p0 + keep], "{at}");
            assert!(
                session.save_state() == s.reference.states[p0 + keep],
                "{at}: state differs"
            );
            fresh.load_state(&s.reference.states[p0 + keep]).unwrap();
            assert!(session.export_cache().unwrap() == fresh.export_cache().unwrap(), "{at}");
            // The next decode: a token other than the block's at this position.
            let next = (block.get(keep).copied().unwrap_or(0) + 1) % s.n_vocab as u32;
            session.eval(&[next], &mut |_, _| true).unwrap();
            fresh.eval(&[next], &mut |_, _| true).unwrap();
            assert_eq!(bits(session.logits()), bits(fresh.logits()), "{at}: next decode");
            assert!(
                session.save_state() == fresh.save_state(),
                "{at}: state after the next decode"
            );
            cases += 1;
        }
    }
    assert_eq!(cases, 3 * (BLOCK + 1));

    // A second verify commits the first block whole; a commit then rolls back to its end.
    let p0 = 40;
    session.load_state(&s.reference.states[p0]).unwrap();
    session.verify(&s.toks[p0..p0 + 3]).unwrap();
    session.verify(&s.toks[p0 + 3..p0 + 7]).unwrap();
    session.commit(0).unwrap();
    assert!(session.save_state() == s.reference.states[p0 + 3]);
}

fn one_line(e: BackendError) -> String {
    let m = e.to_string();
    assert!(!m.is_empty() && !m.contains('\n'), "not one line: {m:?}");
    m
}

/// (c) Misuse is a one-line error that leaves the session as it was.
#[test]
fn verify_and_commit_misuse_are_one_line_errors() {
    let model = model();
    let n_vocab = model.hp.n_vocab as u32;
    let engine = CpuModel::new(model, 1).unwrap();
    let ctx = 16;
    let mut s = engine.open_session(ctx).unwrap();
    let m = one_line(s.commit(0).unwrap_err());
    assert!(m.contains("without a verified block"), "{m}");

    s.eval(&[1, 2, 3], &mut |_, _| true).unwrap();
    let before = s.save_state();
    s.verify(&[4, 5, 6]).unwrap();
    let m = one_line(s.commit(4).unwrap_err());
    assert!(m.contains("cannot keep 4 tokens of a verified block of 3"), "{m}");
    // The block is still pending after the refused commit.
    s.commit(0).unwrap();
    assert_eq!(s.save_state(), before);
    let m = one_line(s.commit(0).unwrap_err());
    assert!(m.contains("without a verified block"), "{m}");

    let past = vec![7u32; ctx - 3 + 1];
    assert_eq!(
        s.verify(&past).unwrap_err(),
        BackendError::ContextFull { needed: ctx + 1, ctx }
    );
    one_line(s.verify(&past).unwrap_err());
    let m = one_line(s.verify(&[]).unwrap_err());
    assert!(m.contains("empty block"), "{m}");
    let m = one_line(s.verify(&[1, n_vocab]).unwrap_err());
    assert!(m.contains("outside the vocabulary"), "{m}");
    // Longer than one pass takes (the scratch holds min(128, ctx) tokens).
    let mut wide = engine.open_session(300).unwrap();
    let m = one_line(wide.verify(&vec![1u32; 129]).unwrap_err());
    assert!(m.contains("longer than the 128"), "{m}");
    assert_eq!((s.n_past(), wide.n_past()), (3, 0));
    assert_eq!(s.save_state(), before, "refused calls change nothing");
    let m = one_line(s.commit(0).unwrap_err());
    assert!(m.contains("without a verified block"), "{m}");
}
