//! Speculative decoding through the engine's decode loop (`engine::generate::generate_speculative`,
//! docs/speculative.md) on the CPU engine, against plain decode (`generate`): greedy output with the
//! prompt-lookup drafter is plain greedy output token for token, and seeded sampling with exact
//! speculative sampling is plain seeded sampling token for token. Tolerance zero: the CPU verify is
//! the decode arithmetic bit for bit (tests/cpu/block_verify.rs), and the exact rule spends the
//! generator as plain sampling does.
//!
//! Every case also counts what the drafter proposed and what was accepted, and fails when nothing
//! was, so it cannot pass with the drafter idle.
//!
//! Model: the tiny architecture cut to a 512-token vocabulary and three layers (uncompressed, ratio
//! 4 with the indexer, ratio 128), generated in memory. Prompts repeat a phrase so prompt lookup has
//! matches from the first step.

use ds4_chat::backend::DeviceModel;
use ds4_chat::backend::cpu::CpuModel;
use ds4_chat::engine::generate::{Limits, SpeculationFigures, Stop};
use ds4_chat::engine::speculate::replay::ReplayDrafter;

use super::small_model::three_layer_model;
use super::speculative_common::{
    ALL_PROMPTS, CTX, GEN, Open, add_figures, budget, check_greedy_prompt_lookup, check_greedy_replay,
    check_logprob_dump, params, plain, plain_greedy, prompts, report_figures, speculative, speculative_with,
};

fn engine() -> CpuModel {
    CpuModel::new(three_layer_model(), 2).unwrap()
}

#[test]
fn greedy_speculative_decode_equals_plain_decode() {
    let cpu = engine();
    let open = || cpu.open_session(CTX).unwrap();
    let wants = plain_greedy(&open, GEN, &ALL_PROMPTS);
    check_greedy_prompt_lookup(&open, &wants, &[Some(4), Some(1), None]);
}

#[test]
fn seeded_sampling_with_exact_speculation_equals_plain_sampling() {
    let cpu = engine();
    let engine: Open = &|| cpu.open_session(CTX).unwrap();
    let mut total = SpeculationFigures::default();
    for (i, prompt) in prompts().iter().enumerate() {
        // A low temperature keeps the output repetitive enough for prompt lookup to be accepted.
        let p = params(0.3, 7 + i as u64);
        let (want, _) = plain(engine, prompt, &p, budget(GEN));
        let (got, _, f, _) = speculative(engine, prompt, &p, budget(GEN), Some(3));
        assert_eq!(got, want, "prompt {i}");
        add_figures(&mut total, &f);
    }
    report_figures("sampling", prompts().len() * GEN, &total);
}

#[test]
fn stops_inside_a_block_commit_only_what_was_handed_out() {
    let cpu = engine();
    let engine: Open = &|| cpu.open_session(CTX).unwrap();
    let p = params(0.0, 1);
    let prompt = &prompts()[0];
    let (long, _) = plain(engine, prompt, &p, budget(64));
    // The replay drafter proposing plain decoding's own continuation with acceptance 1: every draft
    // is kept, so every stop below falls inside a block of kept drafts.
    let replay = || Box::new(ReplayDrafter::new(prompt.len(), long.clone(), 1.0, 512, 3).unwrap());
    // A stop token that plain decoding meets after some tokens: the same tokens, the same stop, and
    // the cache holds exactly the tokens before it.
    let eos = long[10];
    let limits = Limits {
        max_new: 64,
        stop_token: Some(eos),
        decode_last: false,
    };
    let (want, want_stop) = plain(engine, prompt, &p, limits);
    for fixed in [2, 3, 4, 5] {
        let (got, stop, f, n_past) = speculative_with(engine, prompt, &p, limits, Some(fixed), replay());
        assert_eq!((got.clone(), stop), (want.clone(), want_stop), "draft length {fixed}");
        assert_eq!(stop, Stop::Eos);
        assert_eq!(n_past, prompt.len() + got.len(), "draft length {fixed}");
        assert!(f.accepted > 0 && f.accepted == f.drafted, "{f:?}");
    }
    // Budgets that end at every offset of a block: without evaluating the last token, and with.
    for decode_last in [false, true] {
        for max_new in 1..14 {
            let limits = Limits {
                max_new,
                stop_token: None,
                decode_last,
            };
            let (want, _) = plain(engine, prompt, &p, limits);
            let (got, stop, _, n_past) = speculative_with(engine, prompt, &p, limits, Some(4), replay());
            assert_eq!((got, stop), (want, Stop::Budget), "budget {max_new}");
            let evaluated = if decode_last { max_new } else { max_new - 1 };
            assert_eq!(
                n_past,
                prompt.len() + evaluated,
                "budget {max_new}, decode_last {decode_last}"
            );
        }
    }
}

/// Greedy output with the replay drafter at per-token acceptance 0.6 (rejections at random offsets)
/// is plain greedy output.
#[test]
fn greedy_with_the_replay_drafter_equals_plain_decode() {
    let cpu = engine();
    let open = || cpu.open_session(CTX).unwrap();
    check_greedy_replay(&open, &plain_greedy(&open, GEN, &ALL_PROMPTS));
}

/// `run --dump-logprobs` (`greedy_logprob_dump`) with speculation writes plain decoding's dump byte
/// for byte: the steps of accepted drafts come from the verified block's rows, which are the decode's
/// logits bit for bit.
#[test]
fn logprob_dump_with_speculation_is_byte_identical() {
    let cpu = engine();
    let open = || cpu.open_session(CTX).unwrap();
    check_logprob_dump(&open, &plain_greedy(&open, GEN, &ALL_PROMPTS));
}
