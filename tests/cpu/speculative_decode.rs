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

use ds4_chat::backend::cpu::CpuModel;
use ds4_chat::backend::{BackendError, DeviceModel, DeviceSession};
use ds4_chat::engine::events::SamplingParams;
use ds4_chat::engine::generate::{
    Hooks, Limits, Speculation, SpeculationFigures, Stop, generate, generate_speculative, sample_next,
};
use ds4_chat::engine::sampler::Sampler;
use ds4_chat::engine::speculate::accept::{BlockLogits, Outcome, SamplingRule, accept};
use ds4_chat::engine::speculate::drafter::{Draft, Drafter};
use ds4_chat::engine::speculate::prompt_lookup::PromptLookup;
use ds4_chat::engine::speculate::replay::ReplayDrafter;

use super::small_model::three_layer_model;

/// Tokens generated per prompt.
const GEN: usize = 256;
const CTX: usize = 512;

fn engine() -> CpuModel {
    CpuModel::new(three_layer_model(), 2).unwrap()
}

/// Four prompts, each a phrase repeated (with a different phrase length and tail).
fn prompts() -> Vec<Vec<u32>> {
    let phrase = |start: u32, len: u32| (0..len).map(move |i| (start + 37 * i) % 512);
    (0..4u32)
        .map(|p| {
            let mut v: Vec<u32> = vec![1];
            for _ in 0..4 {
                v.extend(phrase(10 + 50 * p, 5 + p));
            }
            v.extend(phrase(10 + 50 * p, 2));
            v
        })
        .collect()
}

/// The hooks under test: `sample_next` for a step, the exact rule for a block; every token recorded.
struct Record {
    sampler: Sampler,
    params: SamplingParams,
    out: Vec<u32>,
}

impl<'b> Hooks<dyn DeviceSession + 'b> for Record {
    fn pick(&mut self, state: &mut (dyn DeviceSession + 'b)) -> Result<u32, BackendError> {
        sample_next(state, &mut self.sampler, &self.params)
    }
    fn token(&mut self, token: u32) -> Result<(), String> {
        self.out.push(token);
        Ok(())
    }
    fn judge(&mut self, draft: &Draft, logits: &BlockLogits<'_>) -> Option<Result<Outcome, String>> {
        Some(accept(
            SamplingRule::Exact,
            draft,
            logits,
            &mut self.sampler,
            &self.params,
        ))
    }
}

fn params(temperature: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        seed: Some(seed),
        ..SamplingParams::default()
    }
}

/// Plain generation from `prompt`: the tokens and why it stopped.
fn plain(engine: &CpuModel, prompt: &[u32], p: &SamplingParams, limits: Limits) -> (Vec<u32>, Stop) {
    let mut s = engine.open_session(CTX).unwrap();
    s.eval(prompt, &mut |_, _| true).unwrap();
    let mut h = Record {
        sampler: Sampler::new(p.seed),
        params: p.clone(),
        out: Vec::new(),
    };
    let (n, stop) = generate(s.as_mut(), limits, &mut h).unwrap();
    assert_eq!(n, h.out.len());
    (h.out, stop)
}

/// Speculative generation from `prompt` with prompt lookup, drafting `fixed` tokens a cycle (the
/// scheduler when `None`): the tokens, why it stopped, the figures, and the session's tokens
/// afterwards.
fn speculative(
    engine: &CpuModel,
    prompt: &[u32],
    p: &SamplingParams,
    limits: Limits,
    fixed: Option<usize>,
) -> (Vec<u32>, Stop, SpeculationFigures, usize) {
    let lookup = Box::new(PromptLookup::new(1, 4).unwrap());
    speculative_with(engine, prompt, p, limits, fixed, lookup)
}

/// `speculative` with `drafter`.
fn speculative_with(
    engine: &CpuModel,
    prompt: &[u32],
    p: &SamplingParams,
    limits: Limits,
    fixed: Option<usize>,
    drafter: Box<dyn Drafter>,
) -> (Vec<u32>, Stop, SpeculationFigures, usize) {
    let mut s = engine.open_session(CTX).unwrap();
    s.eval(prompt, &mut |_, _| true).unwrap();
    let mut h = Record {
        sampler: Sampler::new(p.seed),
        params: p.clone(),
        out: Vec::new(),
    };
    let mut spec = Speculation::new(drafter, prompt);
    if let Some(k) = fixed {
        spec = spec.with_fixed_len(k);
    }
    let (n, stop) = generate_speculative(s.as_mut(), limits, &mut h, &mut spec).unwrap();
    assert_eq!(n, h.out.len());
    assert_eq!(spec.history(), [prompt, &h.out[..]].concat());
    (h.out, stop, spec.figures, s.n_past())
}

fn budget(max_new: usize) -> Limits {
    Limits {
        max_new,
        stop_token: None,
        decode_last: true,
    }
}

#[test]
fn greedy_speculative_decode_equals_plain_decode() {
    let engine = engine();
    let p = params(0.0, 1);
    let mut total = SpeculationFigures::default();
    for (i, prompt) in prompts().iter().enumerate() {
        let (want, _) = plain(&engine, prompt, &p, budget(GEN));
        assert_eq!(want.len(), GEN);
        for fixed in [Some(4), Some(1), None] {
            let (got, stop, f, n_past) = speculative(&engine, prompt, &p, budget(GEN), fixed);
            assert_eq!(got, want, "prompt {i}, draft length {fixed:?}");
            assert_eq!(stop, Stop::Budget);
            // Every handed-out token was evaluated (decode_last), none of the rejected drafts.
            assert_eq!(n_past, prompt.len() + GEN, "prompt {i}, draft length {fixed:?}");
            total.cycles += f.cycles;
            total.drafted += f.drafted;
            total.accepted += f.accepted;
        }
    }
    eprintln!(
        "greedy: {} tokens compared; {} cycles, {} drafted, {} accepted",
        4 * 3 * GEN,
        total.cycles,
        total.drafted,
        total.accepted
    );
    assert!(
        total.drafted > 0 && total.accepted > 0,
        "the drafter was idle: {total:?}"
    );
    assert!(total.accepted < total.drafted, "no draft was ever rejected: {total:?}");
}

#[test]
fn seeded_sampling_with_exact_speculation_equals_plain_sampling() {
    let engine = engine();
    let mut total = SpeculationFigures::default();
    for (i, prompt) in prompts().iter().enumerate() {
        // A low temperature keeps the output repetitive enough for prompt lookup to be accepted.
        let p = params(0.3, 7 + i as u64);
        let (want, _) = plain(&engine, prompt, &p, budget(GEN));
        let (got, _, f, _) = speculative(&engine, prompt, &p, budget(GEN), Some(3));
        assert_eq!(got, want, "prompt {i}");
        total.drafted += f.drafted;
        total.accepted += f.accepted;
    }
    eprintln!("sampling: {} drafted, {} accepted", total.drafted, total.accepted);
    assert!(
        total.drafted > 0 && total.accepted > 0,
        "the drafter was idle: {total:?}"
    );
}

#[test]
fn stops_inside_a_block_commit_only_what_was_handed_out() {
    let engine = engine();
    let p = params(0.0, 1);
    let prompt = &prompts()[0];
    let (long, _) = plain(&engine, prompt, &p, budget(64));
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
    let (want, want_stop) = plain(&engine, prompt, &p, limits);
    for fixed in [2, 3, 4, 5] {
        let (got, stop, f, n_past) = speculative_with(&engine, prompt, &p, limits, Some(fixed), replay());
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
            let (want, _) = plain(&engine, prompt, &p, limits);
            let (got, stop, _, n_past) = speculative_with(&engine, prompt, &p, limits, Some(4), replay());
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
    let engine = engine();
    let p = params(0.0, 1);
    let mut total = SpeculationFigures::default();
    for (i, prompt) in prompts().iter().enumerate() {
        let (want, _) = plain(&engine, prompt, &p, budget(GEN));
        let replay = Box::new(ReplayDrafter::new(prompt.len(), want.clone(), 0.6, 512, i as u64).unwrap());
        let (got, _, f, n_past) = speculative_with(&engine, prompt, &p, budget(GEN), Some(5), replay);
        assert_eq!(got, want, "prompt {i}");
        assert_eq!(n_past, prompt.len() + GEN);
        total.drafted += f.drafted;
        total.accepted += f.accepted;
    }
    eprintln!("replay 0.6: {} drafted, {} accepted", total.drafted, total.accepted);
    assert!(total.accepted > 0 && total.accepted < total.drafted, "{total:?}");
}

/// `run --dump-logprobs` (`greedy_logprob_dump`) with speculation writes plain decoding's dump byte
/// for byte: the steps of accepted drafts come from the verified block's rows, which are the decode's
/// logits bit for bit.
#[test]
fn logprob_dump_with_speculation_is_byte_identical() {
    use ds4_chat::cli::run::greedy_logprob_dump;
    let engine = engine();
    let token_bytes = |id: u32| format!("<{id}>").into_bytes();
    let mut total = SpeculationFigures::default();
    for (i, prompt) in prompts().iter().enumerate() {
        // An EOS the greedy continuation meets for one prompt (the dump ends with its step), never for
        // the others (the dump runs to the budget).
        let (eos, steps) = if i == 0 {
            let out = plain(&engine, prompt, &params(0.0, 1), budget(GEN)).0;
            (out[100], out.iter().position(|&t| t == out[100]).unwrap() + 1)
        } else {
            (u32::MAX, GEN)
        };
        let dump = |spec: Option<&mut Speculation>| {
            let mut s = engine.open_session(CTX).unwrap();
            s.eval(prompt, &mut |_, _| true).unwrap();
            greedy_logprob_dump(s.as_mut(), prompt.len(), 20, GEN, eos, &token_bytes, spec).unwrap()
        };
        let want = dump(None);
        let mut spec = Speculation::new(Box::new(PromptLookup::new(1, 4).unwrap()), prompt).with_fixed_len(4);
        let got = dump(Some(&mut spec));
        assert_eq!(got, want, "prompt {i}");
        assert_eq!(want.matches("{\"step\":").count(), steps, "prompt {i}");
        total.drafted += spec.figures.drafted;
        total.accepted += spec.figures.accepted;
    }
    eprintln!("logprob dumps: {} drafted, {} accepted", total.drafted, total.accepted);
    assert!(
        total.drafted > 0 && total.accepted > 0,
        "the drafter was idle: {total:?}"
    );
}
