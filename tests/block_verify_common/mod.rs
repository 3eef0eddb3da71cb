//! The block verify's cases (docs/model.md#block-verify-and-commit), for any backend: a verified
//! block's logits are bitwise those of decoding its tokens one by one, and a commit of any prefix
//! leaves the session's whole state (checkpoint bytes: tokens, logits, raw window, compressed and
//! indexer rows, both compressor states; and the exported cache) bitwise that of a session that only
//! decoded the kept tokens. Tolerance zero: a verify is the decode arithmetic (the CPU reference, and
//! the GPU kernels in exact arithmetic), and a rollback copies saved floats back.
//!
//! Used by tests/cpu/block_verify.rs (the CPU engine) and tests/emu/verify.rs (the HIP backend on
//! the kernel emulator), on the 3-layer model of `GenSpec::tiny_each_cache_kind` (ratios 0, 4 with
//! the indexer, 128), so every kind of cache is present.
#![allow(dead_code)]

use std::collections::BTreeMap;

use ds4_chat::backend::{BackendError, DeviceSession};
use ds4_chat::model::hparams::HParams;

/// Block length of the rollback cases (the most one verify takes on the GPU).
pub const BLOCK: usize = 8;

/// Opens a fresh session of `ctx` tokens on the backend under test.
pub type Open<'a> = &'a dyn Fn(usize) -> Box<dyn DeviceSession>;

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Checkpoint bytes and logits of a session that decoded `toks` one token at a time, at the positions
/// the checks use (`states[&p]`, `logits[&p]` = after `toks[..p]`).
pub struct Reference {
    pub states: BTreeMap<usize, Vec<u8>>,
    pub logits: BTreeMap<usize, Vec<u32>>,
}

impl Reference {
    fn record(&mut self, p: usize, s: &dyn DeviceSession) {
        self.states.insert(p, s.save_state());
        self.logits.insert(p, bits(s.logits()));
    }
}

/// Every position: `toks` decoded one token at a time from an empty session.
pub fn decode_reference(open: Open, ctx: usize, toks: &[u32]) -> Reference {
    let mut s = open(ctx);
    let mut r = Reference {
        states: BTreeMap::new(),
        logits: BTreeMap::new(),
    };
    r.record(0, s.as_ref());
    for (p, &t) in toks.iter().enumerate() {
        s.eval(&[t], &mut |_, _| true).unwrap();
        r.record(p + 1, s.as_ref());
    }
    r
}

/// Positions `start..=start + BLOCK` of each start: `toks[..start]` prefilled by a session of
/// `open_prefill` (whose state must be bitwise a decode's, as an exact GPU prefill is), then the
/// block's tokens decoded one at a time by the backend under test. For a backend where decoding
/// every position is slow (the kernel emulator).
pub fn prefill_reference(open_prefill: Open, open: Open, ctx: usize, toks: &[u32], starts: &[usize]) -> Reference {
    let mut r = Reference {
        states: BTreeMap::new(),
        logits: BTreeMap::new(),
    };
    for &start in starts {
        let mut pre = open_prefill(ctx);
        pre.eval(&toks[..start], &mut |_, _| true).unwrap();
        let mut s = open(ctx);
        s.load_state(&pre.save_state()).unwrap();
        r.record(start, s.as_ref());
        for (p, &t) in toks.iter().enumerate().skip(start).take(BLOCK) {
            s.eval(&[t], &mut |_, _| true).unwrap();
            r.record(p + 1, s.as_ref());
        }
    }
    r
}

/// Row i of the last verify's block logits.
fn block_row(s: &dyn DeviceSession, i: usize, n_vocab: usize) -> Vec<u32> {
    bits(&s.block_logits()[i * n_vocab..(i + 1) * n_vocab])
}

/// The context of the cases: just past the last boundary the placements need.
pub fn case_ctx() -> usize {
    128 + BLOCK / 2 + 2
}

/// The first position whose indexer sees more than top-k compressed rows (one per 4 tokens), so
/// the selection changes there from "everything visible" to the top-k of the scores.
pub fn first_selection(hp: &HParams) -> usize {
    4 * (hp.idx_top_k + 1) - 1
}

/// Blocks of n tokens at p0 for each `(p0, n)` of `blocks`: row i of the block logits is bitwise the
/// logits after decoding `toks[..=p0 + i]`, `logits()` is the last row, and a commit of the whole
/// block is the decoded state. Returns the rows compared.
pub fn check_block_logits(
    open: Open,
    toks: &[u32],
    reference: &Reference,
    n_vocab: usize,
    blocks: &[(usize, usize)],
) -> usize {
    let mut session = open(case_ctx());
    let mut rows = 0;
    for &(p0, n) in blocks {
        session.load_state(&reference.states[&p0]).unwrap();
        session.verify(&toks[p0..p0 + n]).unwrap();
        assert_eq!(session.block_logits().len(), n * n_vocab);
        assert_eq!(session.n_past(), p0 + n);
        for i in 0..n {
            assert_eq!(
                block_row(session.as_ref(), i, n_vocab),
                reference.logits[&(p0 + i + 1)],
                "block of {n} at {p0}: row {i} differs from decode"
            );
            rows += 1;
        }
        assert_eq!(bits(session.logits()), reference.logits[&(p0 + n)]);
        session.commit(n).unwrap();
        assert_eq!(
            session.save_state(),
            reference.states[&(p0 + n)],
            "block of {n} at {p0}"
        );
    }
    rows
}

/// The three block starts of `check_rollback`, each block crossing one boundary: the raw window's
/// edge, the start of the indexer's selection, a ratio-128 emission (every block also holds a ratio-4
/// emission).
pub fn rollback_starts(hp: &HParams) -> [(&'static str, usize); 3] {
    let window = hp.sliding_window.min(case_ctx());
    [
        ("raw window edge", window - BLOCK / 2),
        ("indexer selection start", first_selection(hp) + 1 - BLOCK / 2),
        ("ratio-128 emission", 128 - BLOCK / 2),
    ]
}

/// Forced rejections at the offsets `keeps` of blocks that cross each boundary (`rollback_starts`):
/// after `commit(keep)` the checkpoint bytes and exported cache equal those of the session that
/// decoded only the kept tokens, and for `next_decode_keeps` the next decode (of a token the block
/// did not propose there) gives bitwise the same logits and state. Returns the cases checked.
pub fn check_rollback(
    open: Open,
    hp: &HParams,
    toks: &[u32],
    reference: &Reference,
    keeps: &[usize],
    next_decode_keeps: &[usize],
) -> usize {
    let ctx = case_ctx();
    let n_vocab = hp.n_vocab;
    // The boundaries below are derived from these; the case positions assume the cut schedule.
    assert_eq!(hp.compress_ratios, vec![0, 4, 128]);
    let window = hp.sliding_window.min(ctx);
    let first_selection = first_selection(hp);
    let ratio_128_emission = 127;
    let mut session = open(ctx);
    let mut fresh = open(ctx);
    let mut cases = 0;
    for (what, p0) in rollback_starts(hp) {
        let block = &toks[p0..p0 + BLOCK];
        // Each block holds a ratio-4 emission and its boundary, strictly inside.
        let inside = |p: usize| p0 < p && p + 1 < p0 + BLOCK;
        match what {
            "raw window edge" => assert!(inside(window), "{what}: {p0}"),
            "indexer selection start" => assert!(inside(first_selection), "{what}: {p0}"),
            _ => assert!(inside(ratio_128_emission), "{what}: {p0}"),
        }
        assert!((p0..p0 + BLOCK).any(|p| (p + 1) % 4 == 0));
        for &keep in keeps {
            session.load_state(&reference.states[&p0]).unwrap();
            session.verify(block).unwrap();
            session.commit(keep).unwrap();
            let at = format!("{what}: block at {p0}, keep {keep}");
            assert_eq!(session.n_past(), p0 + keep, "{at}");
            assert_eq!(bits(session.logits()), reference.logits[&(p0 + keep)], "{at}");
            assert!(
                session.save_state() == reference.states[&(p0 + keep)],
                "{at}: state differs"
            );
            fresh.load_state(&reference.states[&(p0 + keep)]).unwrap();
            assert!(session.export_cache().unwrap() == fresh.export_cache().unwrap(), "{at}");
            cases += 1;
            if !next_decode_keeps.contains(&keep) {
                continue;
            }
            // The next decode: a token other than the block's at this position.
            let next = (block.get(keep).copied().unwrap_or(0) + 1) % n_vocab as u32;
            session.eval(&[next], &mut |_, _| true).unwrap();
            fresh.eval(&[next], &mut |_, _| true).unwrap();
            assert_eq!(bits(session.logits()), bits(fresh.logits()), "{at}: next decode");
            assert!(
                session.save_state() == fresh.save_state(),
                "{at}: state after the next decode"
            );
        }
    }

    // A second verify commits the first block whole; a commit then rolls back to its end.
    let p0 = rollback_starts(hp)[2].1;
    session.load_state(&reference.states[&p0]).unwrap();
    session.verify(&toks[p0..p0 + 3]).unwrap();
    session.verify(&toks[p0 + 3..p0 + 7]).unwrap();
    session.commit(0).unwrap();
    assert!(session.save_state() == reference.states[&(p0 + 3)]);
    cases
}

fn one_line(e: BackendError) -> String {
    let m = e.to_string();
    assert!(!m.is_empty() && !m.contains('\n'), "not one line: {m:?}");
    m
}

/// Misuse is a one-line error that leaves the session as it was. `pass_len`: the most tokens one
/// verify takes on a session of `wide_ctx` tokens (one more is refused).
pub fn check_misuse(open: Open, n_vocab: u32, pass_len: usize, wide_ctx: usize) {
    let ctx = 16;
    let mut s = open(ctx);
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

    // A block past the context: refused before anything is evaluated.
    let mut full = open(ctx);
    full.eval(&vec![1u32; ctx - 2], &mut |_, _| true).unwrap();
    let full_state = full.save_state();
    assert_eq!(
        full.verify(&[7, 7, 7]).unwrap_err(),
        BackendError::ContextFull { needed: ctx + 1, ctx }
    );
    one_line(full.verify(&[7, 7, 7]).unwrap_err());
    assert_eq!(full.save_state(), full_state);
    let m = one_line(s.verify(&[]).unwrap_err());
    assert!(m.contains("empty block"), "{m}");
    let m = one_line(s.verify(&[1, n_vocab]).unwrap_err());
    assert!(m.contains("outside the vocabulary"), "{m}");
    let mut wide = open(wide_ctx);
    let m = one_line(wide.verify(&vec![1u32; pass_len + 1]).unwrap_err());
    assert!(m.contains(&format!("longer than the {pass_len}")), "{m}");
    assert_eq!((s.n_past(), wide.n_past()), (3, 0));
    assert_eq!(s.save_state(), before, "refused calls change nothing");
    let m = one_line(s.commit(0).unwrap_err());
    assert!(m.contains("without a verified block"), "{m}");
}
