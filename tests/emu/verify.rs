//! The HIP backend's block verify and commit (src/backend/hip/block.rs, session/verify.rs) on the
//! kernel emulator, in exact arithmetic: the cases of tests/block_verify_common against the same
//! backend's decode steps, bitwise, with the captured graphs and with direct launches; and the
//! captured verify against the direct one. In fast arithmetic: a whole block against fast decode
//! steps, within a tolerance.
//! Runs with `cargo test --release --features hip --test emu verify::`.
#![cfg(feature = "hip")]

use std::sync::Arc;

use ds4_chat::backend::DeviceSession;
use ds4_chat::backend::agreement::{Agreement, compare_logits};
use ds4_chat::backend::arithmetic::Arithmetic;
use ds4_chat::backend::hip::{HipOptions, HipSession};
use ds4_chat::model::Model;

use crate::block_verify_common::{self as cases, Open};
use crate::hip_emu;
use crate::small_model::three_layer_model;

/// An exact session with 16-token prefill chunks (a verify takes 8), graphs on or off;
/// `matvec_tokens` 1 runs every batch on the GEMMs (a cheap prefill on the emulator, bitwise a
/// decode's in exact arithmetic: tests/emu/prefill.rs).
fn gpu(model: &Arc<Model>, ctx: usize, graph: bool, matvec_tokens: usize) -> Box<dyn DeviceSession> {
    let options = HipOptions {
        prefill_chunk: 16,
        decode_graph: graph,
        matvec_tokens,
        ..HipOptions::default()
    };
    let b: HipSession = hip_emu::exact_backend(model.clone(), ctx, options);
    Box::new(b)
}

/// The cases of tests/block_verify_common on the emulator, cut to what its speed allows: the
/// reference decodes only the blocks (after a prefill), the rollbacks run every offset with the
/// graphs, and direct launches verify one whole block.
#[test]
fn verify_rows_and_rollback_match_decode_bitwise_on_the_emulator() {
    if hip_emu::use_emulated_hip().is_none() {
        return;
    }
    let model = three_layer_model();
    let hp = &model.hp;
    let ctx = cases::case_ctx();
    let toks = hip_emu::lcg_ids(ctx - 1, 17, hp.n_vocab as u64);
    let token_wise = HipOptions::default().matvec_tokens;
    let starts: Vec<usize> = cases::rollback_starts(hp).iter().map(|s| s.1).collect();
    let reference = cases::prefill_reference(
        &|c| gpu(&model, c, true, 1),
        &|c| gpu(&model, c, true, token_wise),
        ctx,
        &toks,
        &starts,
    );
    let every: Vec<usize> = (0..=cases::BLOCK).collect();
    // Graphs: a whole block at the first start, every offset of every start.
    let open: Open = &|c| gpu(&model, c, true, token_wise);
    let blocks = [(starts[0], cases::BLOCK)];
    assert_eq!(
        cases::check_block_logits(open, &toks, &reference, hp.n_vocab, &blocks),
        8
    );
    assert_eq!(cases::check_rollback(open, hp, &toks, &reference, &every, &[4]), 27);
    // Direct launches: a whole block.
    let open: Open = &|c| gpu(&model, c, false, token_wise);
    let blocks = [(starts[2], cases::BLOCK)];
    assert_eq!(
        cases::check_block_logits(open, &toks, &reference, hp.n_vocab, &blocks),
        8
    );
    cases::check_misuse(&|c| gpu(&model, c, true, token_wise), hp.n_vocab as u32, 8, 300);
}

/// Mean over the block's rows of the top-20 |dlogprob| against the fast decode steps: the fast
/// arithmetic's own bound (tests/emu/fast.rs, fast decode against the CPU); measured 0.36 here (one
/// row 2.4, its margins small). A row of the wrong token, position or cache moves most rows by far
/// more (src/backend/agreement.rs).
const FAST_VERIFY_MEAN_LOGPROB: f64 = 1.0;

/// A fast session with 16-token prefill chunks and captured graphs.
fn fast_gpu(model: &Arc<Model>, ctx: usize) -> Box<dyn DeviceSession> {
    let options = HipOptions {
        prefill_chunk: 16,
        arithmetic: Arithmetic::Fast,
        ..HipOptions::default()
    };
    Box::new(hip_emu::emulated_backend(model.clone(), ctx, options))
}

/// In fast arithmetic a verify block's rows are the fast decode steps' within the fast arithmetic's
/// reassociation (the block's attention, router and fused launches group their sums otherwise than a
/// step's; the products take the column kernels or, for the grouped output projection
/// (`Pass::q8_columns`), the one-token kernel over the block, both with the one-token bits per
/// token). Tolerance below; the seeds are fixed, and the rows where the decode step's margin is
/// above 1 (4 here) must all keep its argmax.
#[test]
fn fast_verify_rows_match_fast_decode_on_the_emulator() {
    if hip_emu::use_emulated_hip().is_none() {
        return;
    }
    let model = three_layer_model();
    let hp = &model.hp;
    let ctx = cases::case_ctx();
    let toks = hip_emu::lcg_ids(ctx - 1, 23, hp.n_vocab as u64);
    let start = cases::rollback_starts(hp)[0].1;
    let open: Open = &|c| fast_gpu(&model, c);
    let reference = cases::prefill_reference(open, open, ctx, &toks, &[start]);
    let mut session = open(ctx);
    session.load_state(&reference.states[&start]).unwrap();
    session.verify(&toks[start..start + cases::BLOCK]).unwrap();
    let mut agreement = Agreement::default();
    for i in 0..cases::BLOCK {
        let row = &session.block_logits()[i * hp.n_vocab..(i + 1) * hp.n_vocab];
        let step: Vec<f32> = reference.logits[&(start + i + 1)]
            .iter()
            .map(|b| f32::from_bits(*b))
            .collect();
        agreement.push(compare_logits(row, &step));
    }
    eprintln!("fast verify against fast decode steps: {}", agreement.summary());
    assert!(agreement.confident() >= 4, "{}", agreement.summary());
    assert_eq!(agreement.confident_flips(), 0, "{}", agreement.summary());
    assert!(
        agreement.mean_logprob() <= FAST_VERIFY_MEAN_LOGPROB,
        "mean top-20 |dlogprob| above {FAST_VERIFY_MEAN_LOGPROB}: {}",
        agreement.summary()
    );
}
