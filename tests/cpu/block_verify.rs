//! The CPU engine's block verify and commit against plain decode (the cases and their tolerance:
//! tests/block_verify_common), plus the CPU's own premise checks.
//!
//! Model: the tiny architecture cut to a 512-token vocabulary and three layers (uncompressed, ratio
//! 4 with the indexer, ratio 128), generated in memory, so every kind of cache is present.

use ds4_chat::backend::cpu::{CpuModel, CpuSession};
use ds4_chat::backend::{DeviceModel, DeviceSession};

use super::block_verify_common::{self as cases, Open, Reference};
use super::small_model::{ids, three_layer_model};

struct Setup {
    engine: CpuModel,
    toks: Vec<u32>,
    reference: Reference,
}

fn setup() -> Setup {
    let model = three_layer_model();
    let ctx = cases::case_ctx();
    let toks = ids(ctx - 1, 17, model.hp.n_vocab);
    let engine = CpuModel::new(model, 0).unwrap();
    let reference = cases::decode_reference(&|c| engine.open_session(c).unwrap(), ctx, &toks);
    Setup {
        engine,
        toks,
        reference,
    }
}

/// (a) Blocks of 1..=8 tokens: every row bitwise a decode step's logits.
#[test]
fn block_logits_equal_sequential_decode_bitwise() {
    let s = setup();
    let open: Open = &|c| s.engine.open_session(c).unwrap();
    let n_vocab = s.engine.model().hp.n_vocab;
    let blocks: Vec<(usize, usize)> = (1..=cases::BLOCK).map(|n| (9 * n, n)).collect();
    assert_eq!(
        cases::check_block_logits(open, &s.toks, &s.reference, n_vocab, &blocks),
        36
    );
}

/// (b) Forced rejections at every offset of blocks across the cache boundaries.
#[test]
fn commit_rolls_back_every_rejected_suffix_across_cache_boundaries() {
    let s = setup();
    let hp = s.engine.model().hp.clone();
    // The premise of the indexer placement: up to `first_selection` the ratio-4 layer (1) holds
    // top-k indexer rows, after it one more, so its selection starts inside that block.
    let first_selection = cases::first_selection(&hp);
    let mut probe = s.engine.session(cases::case_ctx()).unwrap();
    let index_rows = |probe: &CpuSession| probe.caches()[1].index.as_ref().map(|(rows, _)| rows.n);
    probe.load_state(&s.reference.states[&first_selection]).unwrap();
    assert_eq!(index_rows(&probe), Some(hp.idx_top_k));
    probe.load_state(&s.reference.states[&(first_selection + 1)]).unwrap();
    assert_eq!(index_rows(&probe), Some(hp.idx_top_k + 1));
    let open: Open = &|c| s.engine.open_session(c).unwrap();
    let every: Vec<usize> = (0..=cases::BLOCK).collect();
    assert_eq!(
        cases::check_rollback(open, &hp, &s.toks, &s.reference, &every, &every),
        27
    );
}

/// (c) Misuse is a one-line error that leaves the session as it was. One pass takes the scratch's
/// min(128, ctx) tokens.
#[test]
fn verify_and_commit_misuse_are_one_line_errors() {
    let model = three_layer_model();
    let n_vocab = model.hp.n_vocab as u32;
    let engine = CpuModel::new(model, 1).unwrap();
    cases::check_misuse(&|c| engine.open_session(c).unwrap(), n_vocab, 128, 300);
}
