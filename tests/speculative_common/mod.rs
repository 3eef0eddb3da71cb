//! Speculative decoding through the engine's decode loop (`engine::generate::generate_speculative`,
//! docs/speculative.md) against plain decode (`generate`), for any backend with a block verify: the
//! prompts, the recording hooks and the two generations the checks compare. Used by
//! tests/cpu/speculative_decode.rs (the CPU engine) and tests/emu/speculative.rs (the HIP backend on
//! the kernel emulator, exact arithmetic).
#![allow(dead_code)]

use ds4_chat::backend::{BackendError, DeviceSession};
use ds4_chat::engine::events::SamplingParams;
use ds4_chat::engine::generate::{
    Hooks, Limits, Speculation, SpeculationFigures, Stop, generate, generate_speculative, sample_next,
};
use ds4_chat::engine::sampler::Sampler;
use ds4_chat::engine::speculate::accept::{BlockLogits, Outcome, SamplingRule, accept};
use ds4_chat::engine::speculate::drafter::{Draft, Drafter};
use ds4_chat::engine::speculate::prompt_lookup::PromptLookup;
use ds4_chat::engine::speculate::replay::ReplayDrafter;

/// Tokens generated per prompt.
pub const GEN: usize = 256;
pub const CTX: usize = 512;

/// Opens a fresh session of `CTX` tokens on the backend under test.
pub type Open<'a> = &'a dyn Fn() -> Box<dyn DeviceSession>;

/// Four prompts, each a phrase repeated (with a different phrase length and tail).
pub fn prompts() -> Vec<Vec<u32>> {
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
pub struct Record {
    pub sampler: Sampler,
    pub params: SamplingParams,
    pub out: Vec<u32>,
}

impl Record {
    /// Hooks that sample with `p` (its seed), nothing recorded yet.
    pub fn new(p: &SamplingParams) -> Record {
        Record {
            sampler: Sampler::new(p.seed),
            params: p.clone(),
            out: Vec::new(),
        }
    }
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

pub fn params(temperature: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        seed: Some(seed),
        ..SamplingParams::default()
    }
}

/// Plain generation from `prompt`: the tokens and why it stopped.
pub fn plain(engine: Open, prompt: &[u32], p: &SamplingParams, limits: Limits) -> (Vec<u32>, Stop) {
    let mut s = engine();
    s.eval(prompt, &mut |_, _| true).unwrap();
    let mut h = Record::new(p);
    let (n, stop) = generate(s.as_mut(), limits, &mut h).unwrap();
    assert_eq!(n, h.out.len());
    (h.out, stop)
}

/// Speculative generation from `prompt` with prompt lookup, drafting `fixed` tokens a cycle (the
/// scheduler when `None`): the tokens, why it stopped, the figures, and the session's tokens
/// afterwards.
pub fn speculative(
    engine: Open,
    prompt: &[u32],
    p: &SamplingParams,
    limits: Limits,
    fixed: Option<usize>,
) -> (Vec<u32>, Stop, SpeculationFigures, usize) {
    let lookup = Box::new(PromptLookup::new(1, 4).unwrap());
    speculative_with(engine, prompt, p, limits, fixed, lookup)
}

/// `speculative` with `drafter`.
pub fn speculative_with(
    engine: Open,
    prompt: &[u32],
    p: &SamplingParams,
    limits: Limits,
    fixed: Option<usize>,
    drafter: Box<dyn Drafter>,
) -> (Vec<u32>, Stop, SpeculationFigures, usize) {
    let mut s = engine();
    s.eval(prompt, &mut |_, _| true).unwrap();
    let mut h = Record::new(p);
    let mut spec = Speculation::new(drafter, prompt);
    if let Some(k) = fixed {
        spec = spec.with_fixed_len(k);
    }
    let (n, stop) = generate_speculative(s.as_mut(), limits, &mut h, &mut spec).unwrap();
    assert_eq!(n, h.out.len());
    assert_eq!(spec.history(), [prompt, &h.out[..]].concat());
    (h.out, stop, spec.figures, s.n_past())
}

pub fn budget(max_new: usize) -> Limits {
    Limits {
        max_new,
        stop_token: None,
        decode_last: true,
    }
}

/// Adds the cycles, drafts, acceptances and commits of `f` to `total`.
pub fn add_figures(total: &mut SpeculationFigures, f: &SpeculationFigures) {
    total.cycles += f.cycles;
    total.drafted += f.drafted;
    total.accepted += f.accepted;
    total.committed += f.committed;
}

/// Prints `total`, the figures of runs under `label` that compared `compared` tokens with plain
/// decoding, and asserts that the drafter drafted and had drafts accepted (else nothing speculative
/// was compared).
pub fn report_figures(label: &str, compared: usize, total: &SpeculationFigures) {
    eprintln!(
        "{label}: {compared} tokens compared; {} cycles, {} drafted, {} accepted",
        total.cycles, total.drafted, total.accepted
    );
    assert!(
        total.drafted > 0 && total.accepted > 0,
        "{label}: the drafter was idle: {total:?}"
    );
}

/// The indices of every prompt of `prompts`.
pub const ALL_PROMPTS: [usize; 4] = [0, 1, 2, 3];

/// Each prompt of `prompts` at `which` with its plain greedy output of `n_gen` tokens: what the
/// checks below compare against (computed once, since a pass is slow on the emulator).
pub fn plain_greedy(engine: Open, n_gen: usize, which: &[usize]) -> Vec<(Vec<u32>, Vec<u32>)> {
    let p = params(0.0, 1);
    let all = prompts();
    let cases: Vec<(Vec<u32>, Vec<u32>)> = which
        .iter()
        .map(|&i| (all[i].clone(), plain(engine, &all[i], &p, budget(n_gen)).0))
        .collect();
    assert!(cases.iter().all(|(_, w)| w.len() == n_gen));
    cases
}

/// Greedy output with prompt lookup, at each draft length of `fixed_lens` (`None`: the scheduler),
/// is plain greedy output (`cases`, from `plain_greedy`).
pub fn check_greedy_prompt_lookup(engine: Open, cases: &[(Vec<u32>, Vec<u32>)], fixed_lens: &[Option<usize>]) {
    let p = params(0.0, 1);
    let mut total = SpeculationFigures::default();
    let n_gen = cases[0].1.len();
    for (i, (prompt, want)) in cases.iter().enumerate() {
        let want = want.clone();
        for &fixed in fixed_lens {
            let (got, stop, f, n_past) = speculative(engine, prompt, &p, budget(n_gen), fixed);
            assert_eq!(got, want, "prompt {i}, draft length {fixed:?}");
            assert_eq!(stop, Stop::Budget);
            // Every handed-out token was evaluated (decode_last), none of the rejected drafts.
            assert_eq!(n_past, prompt.len() + n_gen, "prompt {i}, draft length {fixed:?}");
            add_figures(&mut total, &f);
        }
    }
    report_figures("greedy", cases.len() * fixed_lens.len() * n_gen, &total);
    assert!(total.accepted < total.drafted, "no draft was ever rejected: {total:?}");
}

/// Greedy output with the replay drafter at per-token acceptance 0.6 (rejections at random offsets)
/// is plain greedy output (`cases`, from `plain_greedy`).
pub fn check_greedy_replay(engine: Open, cases: &[(Vec<u32>, Vec<u32>)]) {
    let p = params(0.0, 1);
    let mut total = SpeculationFigures::default();
    for (i, (prompt, want)) in cases.iter().enumerate() {
        let n_gen = want.len();
        let replay = Box::new(ReplayDrafter::new(prompt.len(), want.clone(), 0.6, 512, i as u64).unwrap());
        let (got, _, f, n_past) = speculative_with(engine, prompt, &p, budget(n_gen), Some(5), replay);
        assert_eq!(&got, want, "prompt {i}");
        assert_eq!(n_past, prompt.len() + n_gen);
        add_figures(&mut total, &f);
    }
    eprintln!("replay 0.6: {} drafted, {} accepted", total.drafted, total.accepted);
    assert!(total.accepted > 0 && total.accepted < total.drafted, "{total:?}");
}

/// `run --dump-logprobs` (`greedy_logprob_dump`) with speculation writes plain decoding's dump byte
/// for byte: the steps of accepted drafts come from the verified block's rows, which are the decode's
/// logits bit for bit. The drafter replays plain greedy output (`cases`, from `plain_greedy`) at
/// per-token acceptance 0.6, so the dumps have accepted and rejected drafts however short they are.
pub fn check_logprob_dump(engine: Open, cases: &[(Vec<u32>, Vec<u32>)]) {
    use ds4_chat::cli::run::greedy_logprob_dump;
    let token_bytes = |id: u32| format!("<{id}>").into_bytes();
    let mut total = SpeculationFigures::default();
    for (i, (prompt, out)) in cases.iter().enumerate() {
        let n_gen = out.len();
        // An EOS the greedy continuation meets for one prompt (the dump ends with its step, at least
        // 2/5 of the way), never for the others (the dump runs to the budget).
        let (eos, steps) = if i == 0 {
            let t = out[2 * n_gen / 5];
            (t, out.iter().position(|&x| x == t).unwrap() + 1)
        } else {
            (u32::MAX, n_gen)
        };
        let dump = |spec: Option<&mut Speculation>| {
            let mut s = engine();
            s.eval(prompt, &mut |_, _| true).unwrap();
            greedy_logprob_dump(s.as_mut(), prompt.len(), 20, n_gen, eos, &token_bytes, spec).unwrap()
        };
        let want = dump(None);
        let replay = ReplayDrafter::new(prompt.len(), out.clone(), 0.6, 512, 7 + i as u64).unwrap();
        let mut spec = Speculation::new(Box::new(replay), prompt).with_fixed_len(4);
        let got = dump(Some(&mut spec));
        assert_eq!(got, want, "prompt {i}");
        assert_eq!(want.matches("{\"step\":").count(), steps, "prompt {i}");
        add_figures(&mut total, &spec.figures);
    }
    eprintln!("logprob dumps: {} drafted, {} accepted", total.drafted, total.accepted);
    assert!(
        total.drafted > 0 && total.accepted > 0 && total.accepted < total.drafted,
        "the dumps saw no accepted or no rejected draft: {total:?}"
    );
}
