//! `ds4-chat run`: one-shot headless generation, like ds4's CLI with `-p`
//! (docs/prompt.md#one-shot-prompt, #stop-conditions; docs/sampler.md).
//!
//! Renders the one-shot prompt (or takes raw ids), prefills, then samples and streams the answer to
//! stdout (reasoning to stderr) until EOS, `-n`, or the context is full. `--dump-logprobs` instead
//! writes ds4's greedy logprob dump (docs/sampler.md#log-probability-dumps). Owns argument handling and
//! printing only.

use std::collections::VecDeque;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::CliResult;
use crate::backend::{BackendError, DeviceSession};
use crate::engine::backend_open::{PlacementRequest, open_device_model};
use crate::engine::events::SamplingParams;
use crate::engine::generate::{
    GenerateError, Hooks, Limits, Speculation, Stop, generate, generate_speculative, sample_next,
};
use crate::engine::logprobs::TokenScore;
use crate::engine::logprobs::{self, LogprobDump};
use crate::engine::sampler::{Sampler, argmax};
use crate::engine::settings::{self, named};
use crate::engine::speculate::Speculate;
use crate::engine::speculate::accept::{BlockLogits, Outcome, SamplingRule, accept, greedy};
use crate::engine::speculate::drafter::Draft;
use crate::model::chat::{ThinkMode, one_shot_prompt};
use crate::model::detok::StreamDecoder;
use crate::model::detok::TextKind;
use crate::model::tokenizer::Tokenizer;
use crate::model::weights::Model;

/// Open and bind a model file; the error is one line naming the file.
pub fn open_model(path: &Path) -> Result<Arc<Model>, String> {
    Model::open(path).map(Arc::new).map_err(|e| e.to_string())
}

/// A backend session for `model` (engine::backend_open's policy); a CPU fallback's reason goes to
/// stderr.
pub fn open_device_session(
    model: Arc<Model>,
    at: &PlacementRequest,
    ctx: usize,
) -> Result<Box<dyn DeviceSession>, String> {
    let opened = open_device_model(model, at, ctx)?;
    if let Some(reason) = &opened.fallback_reason {
        eprintln!("ds4-chat: using the CPU backend: {reason}");
    }
    Ok(opened.session)
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model file (ds4 GGUF).
    #[arg(short = 'm', long)]
    pub model: PathBuf,
    /// Prompt text (a user message; if it starts with the BOS string it is taken as fully rendered).
    #[arg(short = 'p', long)]
    pub prompt: Option<String>,
    /// Read the prompt text from this file.
    #[arg(long, conflicts_with = "prompt")]
    pub prompt_file: Option<PathBuf>,
    /// Feed these comma-separated token ids instead of a rendered prompt.
    #[arg(long, value_delimiter = ',', num_args = 1.., conflicts_with = "prompt")]
    pub tokens: Option<Vec<u32>>,
    #[command(flatten)]
    pub think: super::ThinkArgs,
    #[command(flatten)]
    pub generation: super::GenerationArgs,
    /// Context size in tokens (2 ..= 1048576) [default: 32768].
    #[arg(short = 'c', long, value_name = "N", allow_negative_numbers = true)]
    pub ctx: Option<i64>,
    /// Write ds4's greedy logprob dump (JSON) here instead of sampling.
    #[arg(long)]
    pub dump_logprobs: Option<PathBuf>,
    /// Entries per step in the dump (1 ..= 128).
    #[arg(long, default_value_t = 20, allow_negative_numbers = true)]
    pub logprobs_top_k: i64,
    #[command(flatten)]
    pub placement: super::PlacementArgs,
    #[command(flatten)]
    pub config: super::ConfigArg,
}

/// `run`'s answers are longer than the app's by default: ds4's CLI default.
pub const RUN_MAX_TOKENS: u32 = 50000;

/// `run`'s settings after the range checks.
struct RunSettings {
    ctx: usize,
    max_tokens: usize,
    params: SamplingParams,
    logprobs_top_k: usize,
    placement: super::PlacementRequest,
    think: ThinkMode,
    system: String,
    speculate: Speculate,
    speculate_sampling: SamplingRule,
    dspark: crate::engine::speculate::dspark::DsparkSettings,
}

impl RunSettings {
    /// The config file over `run`'s defaults, then every flag checked against its range; the error is
    /// one line naming the flag or key.
    fn from_args(a: &Args) -> Result<RunSettings, String> {
        let base = super::Config {
            max_tokens: RUN_MAX_TOKENS,
            ..Default::default()
        };
        let mut c = a.config.load(base)?;
        super::apply_cli_ctx(a.ctx, &mut c)?;
        a.placement.apply(&mut c)?;
        a.think.apply(&mut c);
        a.generation.apply(&mut c)?;
        Ok(RunSettings {
            ctx: c.ctx as usize,
            max_tokens: c.max_tokens as usize,
            params: c.sampling.clone(),
            logprobs_top_k: named("--logprobs-top-k", settings::check_logprobs_top_k(a.logprobs_top_k))?,
            placement: super::placement_of(&c),
            think: c.think,
            system: c.system,
            speculate: c.speculate,
            speculate_sampling: c.speculate_sampling,
            dspark: c.dspark,
        })
    }
}

/// Most new tokens that fit: `-n`, and the context keeps one slot free (docs/prompt.md#stop-conditions).
pub fn generation_budget(max_tokens: usize, ctx: usize, n_past: usize) -> usize {
    let room = ctx.saturating_sub(n_past);
    if room <= 1 { 0 } else { max_tokens.min(room - 1) }
}

/// Sample up to `budget` tokens after the prefilled state in `backend`, handing each to `emit`; EOS
/// ends the loop and is not emitted. With `spec`, speculatively, its drafts accepted by `spec`'s rule
/// (`SamplingRule::Exact`: the output is plain sampling's). Returns the number of tokens emitted and why it stopped.
pub fn sample_loop(
    backend: &mut dyn DeviceSession,
    sampler: &mut Sampler,
    params: &SamplingParams,
    budget: usize,
    eos: u32,
    spec: Option<(&mut Speculation, SamplingRule)>,
    emit: &mut dyn FnMut(u32) -> Result<(), String>,
) -> Result<(usize, Stop), String> {
    struct Sampling<'a> {
        sampler: &'a mut Sampler,
        params: &'a SamplingParams,
        rule: SamplingRule,
        emit: &'a mut dyn FnMut(u32) -> Result<(), String>,
    }
    impl<'b> Hooks<dyn DeviceSession + 'b> for Sampling<'_> {
        fn pick(&mut self, state: &mut (dyn DeviceSession + 'b)) -> Result<u32, BackendError> {
            sample_next(state, self.sampler, self.params)
        }
        fn token(&mut self, token: u32) -> Result<(), String> {
            (self.emit)(token)
        }
        fn judge(&mut self, draft: &Draft, logits: &BlockLogits<'_>) -> Option<Result<Outcome, String>> {
            Some(accept(self.rule, draft, logits, self.sampler, self.params))
        }
    }
    let limits = Limits {
        max_new: budget,
        stop_token: Some(eos),
        decode_last: false,
    };
    let rule = spec.as_ref().map_or(SamplingRule::Exact, |s| s.1);
    let mut hooks = Sampling {
        sampler,
        params,
        rule,
        emit,
    };
    match spec.map(|s| s.0) {
        Some(spec) => generate_speculative(backend, limits, &mut hooks, spec),
        None => generate(backend, limits, &mut hooks),
    }
    .map_err(|e| e.to_string())
}

/// ds4's `--dump-logprobs` (docs/sampler.md#log-probability-dumps): from the prefilled state, a greedy
/// continuation of up to `budget` steps, each recording the selected token and the top-`k` logprobs;
/// the step that selects EOS is written and ends the dump. With `spec`, speculatively: the steps of
/// accepted drafts read their rows of the verified block's logits, which are the decode's bit for
/// bit on an exact verify, so the dump is plain decoding's byte for byte.
pub fn greedy_logprob_dump(
    backend: &mut dyn DeviceSession,
    prompt_tokens: usize,
    k: usize,
    budget: usize,
    eos: u32,
    token_bytes: &dyn Fn(u32) -> Vec<u8>,
    spec: Option<&mut Speculation>,
) -> Result<String, String> {
    /// Each chosen token with its top logprobs, queued until it is handed out (a verified block
    /// chooses several at once).
    struct Dump<'a> {
        k: usize,
        chosen: VecDeque<(u32, Vec<TokenScore>)>,
        dump: LogprobDump,
        token_bytes: &'a dyn Fn(u32) -> Vec<u8>,
    }
    impl Dump<'_> {
        fn write_next(&mut self) {
            if let Some((token, top)) = self.chosen.pop_front() {
                self.dump.push_step(token, &top, self.token_bytes);
            }
        }
    }
    impl<'b> Hooks<dyn DeviceSession + 'b> for Dump<'_> {
        fn pick(&mut self, state: &mut (dyn DeviceSession + 'b)) -> Result<u32, BackendError> {
            let token = argmax(state.logits());
            self.chosen
                .push_back((token, logprobs::top_logprobs(state.logits(), self.k)));
            Ok(token)
        }
        fn token(&mut self, _token: u32) -> Result<(), String> {
            self.write_next();
            Ok(())
        }
        fn judge(&mut self, draft: &Draft, logits: &BlockLogits<'_>) -> Option<Result<Outcome, String>> {
            let outcome = match greedy(&draft.tokens, logits) {
                Ok(o) => o,
                Err(e) => return Some(Err(e)),
            };
            let chosen = draft.tokens[..outcome.accepted].iter().chain([&outcome.next]);
            for (i, &token) in chosen.enumerate() {
                self.chosen
                    .push_back((token, logprobs::top_logprobs(logits.row(i), self.k)));
            }
            Some(Ok(outcome))
        }
    }
    let mut hooks = Dump {
        k,
        chosen: VecDeque::new(),
        dump: LogprobDump::new(prompt_tokens, backend.ctx(), k),
        token_bytes,
    };
    let limits = Limits {
        max_new: budget,
        stop_token: Some(eos),
        decode_last: false,
    };
    let result = match spec {
        Some(spec) => generate_speculative(backend, limits, &mut hooks, spec),
        None => generate(backend, limits, &mut hooks),
    };
    let stop = result.map_err(|e| match e {
        GenerateError::Decode(e) => format!("decode failed while dumping logprobs: {e}"),
        e => e.to_string(),
    })?;
    if stop.1 == Stop::Eos {
        // The EOS step is written too.
        hooks.write_next();
    }
    Ok(hooks.dump.finish())
}

/// Speculation's figures on stderr, beside the timings.
fn print_speculation(speculate: Speculate, spec: Option<&Speculation>) {
    if let Some(f) = spec.map(|s| s.figures) {
        eprintln!(
            "ds4-chat: speculate {}: {} cycles, {} drafted, {} accepted, {:.2} tokens per cycle",
            speculate.name(),
            f.cycles,
            f.drafted,
            f.accepted,
            f.tokens_per_cycle()
        );
    }
}

pub fn run(args: Args) -> CliResult {
    let set = RunSettings::from_args(&args)?;
    let model = open_model(&args.model)?;
    let ctx = settings::check_session_ctx(set.ctx, &model.hp)?;
    let tok = Tokenizer::from_gguf(&model.file).map_err(|e| e.to_string())?;
    let specials = *tok.specials();
    // ds4's CLI thinks by default (the config's default too).
    let requested = set.think;

    let prompt_text = match (&args.prompt, &args.prompt_file) {
        (Some(p), None) => Some(p.clone()),
        (None, Some(f)) => {
            Some(std::fs::read_to_string(f).map_err(|e| format!("cannot read --prompt-file {}: {e}", f.display()))?)
        }
        (None, None) => None,
        (Some(_), Some(_)) => return Err("give only one of -p and --prompt-file".into()),
    };
    let prompt: Vec<u32> = match (&args.tokens, prompt_text) {
        (Some(ids), None) => ids.clone(),
        (None, Some(text)) => one_shot_prompt(&tok, &set.system, &text, requested, ctx as u32).ids,
        (Some(_), Some(_)) => return Err("give either a prompt or --tokens, not both".into()),
        (None, None) => return Err("no prompt: give -p TEXT, --prompt-file FILE or --tokens IDS".into()),
    };
    if prompt.is_empty() {
        return Err("the prompt has no tokens".into());
    }
    let n_vocab = model.hp.n_vocab;
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(format!("token id {bad} is outside the vocabulary (n_vocab {n_vocab})"));
    }
    // A prompt must be strictly shorter than the context (docs/prompt.md#stop-conditions).
    if prompt.len() >= ctx {
        return Err(format!(
            "the prompt has {} tokens and does not fit a context of {ctx} (raise --ctx)",
            prompt.len()
        ));
    }

    let mut backend = open_device_session(model.clone(), &set.placement, ctx)?;
    // The DSpark drafter is attached before the prompt, so it reads the prompt's target rows.
    let dspark = match set.speculate {
        Speculate::Dspark => {
            let (drafter, warning) = set.dspark.open(&model, backend.as_mut(), ctx)?;
            if let Some(w) = warning {
                eprintln!("ds4-chat: {w}");
            }
            Some(drafter)
        }
        _ => None,
    };
    let t_prefill = Instant::now();
    // Long prefills on a big model take a while: show progress when stderr is a terminal.
    let show_progress = std::io::stderr().is_terminal();
    backend
        .eval(&prompt, &mut |done, total| {
            if show_progress {
                eprint!("\rprefill {done}/{total}");
            }
            true
        })
        .map_err(|e| format!("prompt processing failed: {e}"))?;
    if show_progress {
        eprint!("\r\x1b[K");
    }
    let prefill_s = t_prefill.elapsed().as_secs_f64();
    let budget = generation_budget(set.max_tokens, ctx, backend.n_past());

    let mut spec = dspark
        .or_else(|| set.speculate.drafter())
        .map(|d| Speculation::new(d, &prompt));
    if spec.is_some() && !backend.has_block_verify() {
        eprintln!(
            "ds4-chat: the {} backend has no block verify; --speculate {} decodes plainly",
            backend.name(),
            set.speculate.name()
        );
    }
    if let Some(path) = &args.dump_logprobs {
        // Greedy regardless of --temp, as ds4 does.
        let text = greedy_logprob_dump(
            backend.as_mut(),
            prompt.len(),
            set.logprobs_top_k,
            budget,
            specials.eos,
            &|id| tok.token_bytes(id),
            spec.as_mut(),
        )?;
        print_speculation(set.speculate, spec.as_ref());
        std::fs::write(path, text).map_err(|e| format!("cannot write --dump-logprobs {}: {e}", path.display()))?;
        return Ok(());
    }

    let params = set.params;
    let mut sampler = Sampler::new(params.seed);
    // Reasoning runs from an opening `<think>` at the end of the prompt until `</think>`; it goes to
    // stderr so stdout carries only the answer. The decoder keeps output whole UTF-8 and drops tags.
    let start = if prompt.last() == Some(&specials.think_start) {
        TextKind::Reasoning
    } else {
        TextKind::Answer
    };
    let mut decoder = StreamDecoder::with_kind(specials.eos, start);
    let mut answer_ends_with_newline = true;
    let mut reasoning_ends_with_newline = true;
    let mut write_deltas = |deltas: Vec<crate::model::detok::TextDelta>| -> Result<(), String> {
        for d in deltas {
            let result = match d.kind {
                TextKind::Reasoning => {
                    reasoning_ends_with_newline = d.text.ends_with('\n');
                    let mut e = std::io::stderr().lock();
                    e.write_all(d.text.as_bytes()).and_then(|_| e.flush())
                }
                TextKind::Answer => {
                    answer_ends_with_newline = d.text.ends_with('\n');
                    let mut o = std::io::stdout().lock();
                    o.write_all(d.text.as_bytes()).and_then(|_| o.flush())
                }
            };
            result.map_err(|e| format!("cannot write output: {e}"))?;
        }
        Ok(())
    };
    let t_decode = Instant::now();
    let (generated, _why) = sample_loop(
        backend.as_mut(),
        &mut sampler,
        &params,
        budget,
        specials.eos,
        spec.as_mut().map(|s| (s, set.speculate_sampling)),
        &mut |t| write_deltas(decoder.push(&tok, t)),
    )?;
    write_deltas(decoder.finish())?;
    let decode_s = t_decode.elapsed().as_secs_f64();
    if !answer_ends_with_newline {
        let _ = std::io::stdout().lock().write_all(b"\n");
    }
    if !reasoning_ends_with_newline {
        eprintln!();
    }
    eprintln!(
        "ds4-chat: prompt {} tokens, prefill {:.2} t/s, generation {:.2} t/s ({generated} tokens)",
        prompt.len(),
        prompt.len() as f64 / prefill_s.max(1e-9),
        generated as f64 / decode_s.max(1e-9),
    );
    print_speculation(set.speculate, spec.as_ref());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{MemoryReport, Progress};

    /// A backend whose next-token logits are a fixed function of the position: at position p the
    /// logit of token `script[p]` is 5 and every other token's is 0 (vocabulary of 8).
    struct ScriptedSession {
        script: Vec<u32>,
        n_past: usize,
        evals: Vec<Vec<u32>>,
        logits: Vec<f32>,
        ctx: usize,
    }

    impl ScriptedSession {
        fn new(script: &[u32], ctx: usize) -> Self {
            ScriptedSession {
                script: script.to_vec(),
                n_past: 0,
                evals: vec![],
                logits: vec![0.0; 8],
                ctx,
            }
        }
        fn refresh(&mut self) {
            self.logits = vec![0.0; 8];
            if let Some(&t) = self.script.get(self.n_past) {
                self.logits[t as usize] = 5.0;
            }
        }
    }

    impl DeviceSession for ScriptedSession {
        fn name(&self) -> &'static str {
            "scripted"
        }
        fn device_name(&self) -> String {
            "test".into()
        }
        fn ctx(&self) -> usize {
            self.ctx
        }
        fn n_past(&self) -> usize {
            self.n_past
        }
        fn eval(&mut self, tokens: &[u32], _progress: Progress<'_>) -> Result<(), BackendError> {
            if self.n_past + tokens.len() > self.ctx {
                return Err(BackendError::ContextFull {
                    needed: self.n_past + tokens.len(),
                    ctx: self.ctx,
                });
            }
            self.evals.push(tokens.to_vec());
            self.n_past += tokens.len();
            self.refresh();
            Ok(())
        }
        fn logits(&self) -> &[f32] {
            &self.logits
        }
        fn reset(&mut self) {
            self.n_past = 0;
            self.refresh();
        }
        fn save_state(&self) -> Vec<u8> {
            Vec::new()
        }
        fn load_state(&mut self, _bytes: &[u8]) -> Result<(), BackendError> {
            Ok(())
        }
        fn memory(&self) -> MemoryReport {
            MemoryReport::default()
        }
    }

    fn greedy() -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn budget_keeps_one_context_slot_free() {
        assert_eq!(generation_budget(100, 10, 4), 5);
        assert_eq!(generation_budget(3, 10, 4), 3);
        assert_eq!(generation_budget(100, 10, 9), 0);
        assert_eq!(generation_budget(100, 10, 10), 0);
    }

    /// `sample_loop` (greedy, EOS id 7, `budget` tokens) on a backend scripted with `script` after
    /// evaluating `prompt`: the count and stop reason it returns, the tokens it emitted, the backend.
    fn greedy_sample_loop(script: &[u32], prompt: &[u32], budget: usize) -> (usize, Stop, Vec<u32>, ScriptedSession) {
        let mut b = ScriptedSession::new(script, 64);
        b.eval(prompt, &mut |_, _| true).unwrap();
        let mut out = vec![];
        let mut s = Sampler::new(Some(1));
        let (n, why) = sample_loop(&mut b, &mut s, &greedy(), budget, 7, None, &mut |t| {
            out.push(t);
            Ok(())
        })
        .unwrap();
        (n, why, out, b)
    }

    #[test]
    fn sample_loop_stops_at_eos_without_emitting_it() {
        // Prompt of 2 tokens, then the script says 3, 4, EOS(7).
        let (n, why, out, _) = greedy_sample_loop(&[0, 0, 3, 4, 7, 5], &[1, 2], 50);
        assert_eq!((n, why, out), (2, Stop::Eos, vec![3, 4]));
    }

    #[test]
    fn sample_loop_honours_the_budget() {
        let (n, why, out, b) = greedy_sample_loop(&[0, 3, 4, 5, 6, 2], &[1], 3);
        assert_eq!((n, why, out), (3, Stop::Budget, vec![3, 4, 5]));
        // The last sampled token is not evaluated: prompt + 2 decodes.
        assert_eq!(b.n_past(), 3);
    }

    #[test]
    fn dump_records_greedy_steps_through_eos() {
        let mut b = ScriptedSession::new(&[0, 3, 7, 5], 64);
        b.eval(&[1], &mut |_, _| true).unwrap();
        let text = greedy_logprob_dump(&mut b, 1, 2, 10, 7, &|id| vec![b'a' + id as u8], None).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let steps = v["steps"].as_array().unwrap();
        assert_eq!(steps.len(), 2, "the EOS step is written, then the dump ends");
        assert_eq!(steps[0]["selected"]["id"], 3);
        assert_eq!(steps[1]["selected"]["id"], 7);
        assert_eq!(steps[1]["selected"]["text"], "h");
        // Logits (5, then seven 0s): logprob of the top = 5 − ln(e^5 + 7) = −0.00670.
        let lp = steps[0]["top_logprobs"][0]["logprob"].as_f64().unwrap();
        assert!((lp - (5.0 - (5f64.exp() + 7.0).ln())).abs() < 1e-6, "{lp}");
        // Second entry: the first of the tied zeros, id 0.
        assert_eq!(steps[0]["top_logprobs"][1]["token"]["id"], 0);
        assert_eq!(v["ctx"], 64);
        assert_eq!(v["top_k"], 2);
    }
}
