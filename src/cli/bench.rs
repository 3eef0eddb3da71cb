//! `ds4-chat bench`: prefill and decode speed at growing context frontiers, as a CSV shaped like
//! ds4-bench's, plus the decode step's weight bytes per token and the fraction of the memory
//! bandwidth roofline it reaches (docs/model.md#weight-bytes-per-token). With `--speculate dspark`,
//! also the draft pass's cost beside a plain decode step at each frontier (docs/dspark.md#cost).
//!
//! Owns the measurement loop only: the backend is opened by `engine::backend_open`, byte counts come
//! from `model::accounting`.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::CliResult;
use crate::backend::{BackendError, DeviceSession};
use crate::engine::backend_open::open_device_model;
use crate::engine::generate::{Hooks, Limits, Speculation, generate, generate_speculative};
use crate::engine::settings::{self, named};
use crate::engine::speculate::accept::{BlockLogits, Outcome};
use crate::engine::speculate::drafter::{Draft, Drafter};
use crate::engine::speculate::dspark::{DraftPass, PassLog};
use crate::model::Model;
use crate::model::accounting::{table_from_model, weight_bytes_per_token};
use crate::model::dspark::{DsparkModel, pass_bytes};
use crate::model::tokenizer::Tokenizer;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF model file.
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// First context frontier (tokens prefilled before the first decode measurement).
    #[arg(long, default_value_t = 2048)]
    pub ctx_start: usize,
    /// Last context frontier.
    #[arg(long, default_value_t = 8192)]
    pub ctx_max: usize,
    /// Frontier increment.
    #[arg(long, default_value_t = 2048)]
    pub step_incr: usize,
    /// Tokens decoded at each frontier.
    #[arg(long, default_value_t = 64)]
    pub gen_tokens: usize,
    /// Text whose tokens form the prompt; without it a deterministic token stream is used.
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// Peak memory bandwidth in GB/s for the roofline column (default: measured, a streaming read
    /// of host memory on the CPU, a device-to-device copy counting read + written bytes on a GPU).
    #[arg(long, allow_negative_numbers = true)]
    pub peak_gbps: Option<f64>,
    /// Write the CSV here instead of stdout.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Block lengths whose verify pass is timed at each frontier beside a decode step, e.g. `3,6`
    /// (backends with a block verify; docs/speculative.md#measuring).
    #[arg(long, value_delimiter = ',')]
    pub verify_cost: Vec<usize>,
    /// Per-token acceptances of the replay drafter, a measurement tool that proposes the plain
    /// run's own continuation (docs/speculative.md#replay-drafter): at each frontier, decode again
    /// with it at each acceptance and report the speed beside plain decode, e.g. `0,0.6,0.8,0.95`.
    #[arg(long, value_delimiter = ',')]
    pub replay_acceptance: Vec<f64>,
    #[command(flatten)]
    pub placement: super::PlacementArgs,
    #[command(flatten)]
    pub config: super::ConfigArg,
}

/// One CSV row.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    pub ctx_tokens: usize,
    pub prefill_tokens: usize,
    pub prefill_tps: f64,
    pub gen_tokens: usize,
    pub gen_tps: f64,
    pub kvcache_bytes: u64,
}

pub const CSV_HEADER: &str = "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes,weight_bytes_per_token,decode_gbps,roofline_pct";

impl BenchRow {
    /// The CSV line: ds4-bench's six columns, then bytes/token, achieved GB/s and % of `peak_gbps`.
    pub fn csv(&self, weight_bytes_per_token: u64, peak_gbps: f64) -> String {
        let gbps = weight_bytes_per_token as f64 * self.gen_tps / 1e9;
        let pct = if peak_gbps > 0.0 { 100.0 * gbps / peak_gbps } else { 0.0 };
        format!(
            "{},{},{:.2},{},{:.2},{},{},{:.1},{:.2}",
            self.ctx_tokens,
            self.prefill_tokens,
            self.prefill_tps,
            self.gen_tokens,
            self.gen_tps,
            self.kvcache_bytes,
            weight_bytes_per_token,
            gbps,
            pct
        )
    }
}

/// Frontiers ctx_start, ctx_start+step, …, ending exactly at ctx_max.
pub fn frontiers(start: usize, max: usize, step: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut f = start.min(max);
    loop {
        v.push(f);
        if f >= max {
            return v;
        }
        f = (f + step.max(1)).min(max);
    }
}

/// A deterministic stream of ordinary (non-added) token ids, for benches without a prompt file. A
/// model without tokenizer metadata (synthetic test models) draws from its whole vocabulary.
fn synthetic_tokens(tok: Option<&Tokenizer>, n_vocab: usize, n: usize) -> Vec<u32> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let id = (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as u32 % n_vocab as u32;
        if !tok.is_some_and(|t| t.is_added(id)) {
            out.push(id);
        }
    }
    out
}

/// Greedy argmax that never picks `exclude` (decode keeps going past EOS, as ds4-bench does).
fn argmax_excluding(logits: &[f32], exclude: u32) -> u32 {
    let mut best = (f32::NEG_INFINITY, 0u32);
    for (i, &l) in logits.iter().enumerate() {
        if i as u32 != exclude && l > best.0 {
            best = (l, i as u32);
        }
    }
    best.1
}

/// Decode keeps going past EOS, as ds4-bench does: greedy picks that never take `eos`.
struct GreedyPastEos {
    eos: u32,
    /// Every token handed out, in order.
    out: Vec<u32>,
}

impl<'b> Hooks<dyn DeviceSession + 'b> for GreedyPastEos {
    fn pick(&mut self, state: &mut (dyn DeviceSession + 'b)) -> Result<u32, BackendError> {
        Ok(argmax_excluding(state.logits(), self.eos))
    }
    fn token(&mut self, token: u32) -> Result<(), String> {
        self.out.push(token);
        Ok(())
    }
    /// The greedy rule (`speculate::accept::greedy`) with this pick: drafts kept while they equal
    /// the argmax without EOS, then that argmax.
    fn judge(&mut self, draft: &Draft, logits: &BlockLogits<'_>) -> Option<Result<Outcome, String>> {
        if logits.rows() != draft.len() + 1 {
            return Some(Err(format!("{} drafts with {} logit rows", draft.len(), logits.rows())));
        }
        let accepted = (0..draft.len())
            .take_while(|&i| argmax_excluding(logits.row(i), self.eos) == draft.tokens[i])
            .count();
        Some(Ok(Outcome {
            accepted,
            next: argmax_excluding(logits.row(accepted), self.eos),
        }))
    }
}

/// Plain decode steps timed beside the draft passes at each frontier.
const TIMED_STEPS: usize = 16;

/// `GreedyPastEos` that times every decode step (pick, token, decode).
struct TimedSteps {
    inner: GreedyPastEos,
    last: Instant,
    steps: Vec<f64>,
}

impl<'b> Hooks<dyn DeviceSession + 'b> for TimedSteps {
    fn pick(&mut self, state: &mut (dyn DeviceSession + 'b)) -> Result<u32, BackendError> {
        self.inner.pick(state)
    }
    fn token(&mut self, token: u32) -> Result<(), String> {
        self.inner.token(token)
    }
    fn decoded(&mut self, _state: &(dyn DeviceSession + 'b), _generated: usize) -> bool {
        self.steps.push(self.last.elapsed().as_secs_f64());
        self.last = Instant::now();
        true
    }
}

/// The median (the mean of the middle two for an even count; 0 for none).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The draft pass's cost at one frontier (docs/dspark.md#cost): the median pass time against the
/// median plain step, and the weight bytes a pass read (median over the passes) against a step's.
fn draft_cost_line(
    frontier: usize,
    passes: &[DraftPass],
    pass_bytes: &[u64],
    steps: &[f64],
    step_bytes: u64,
) -> String {
    if passes.is_empty() {
        return format!("ds4-chat bench: ctx {frontier}: dspark ran no draft pass");
    }
    let pass = median(&passes.iter().map(|p| p.secs).collect::<Vec<_>>());
    let step = median(steps);
    let bytes = median(&pass_bytes.iter().map(|&b| b as f64).collect::<Vec<_>>());
    let stages = passes[0].reads.experts.len();
    let experts: Vec<String> = (0..stages)
        .map(|st| {
            let sum: usize = passes
                .iter()
                .map(|p| p.reads.experts.get(st).copied().unwrap_or(0))
                .sum();
            format!("{:.1}", sum as f64 / passes.len() as f64)
        })
        .collect();
    let lm = passes.iter().filter(|p| p.reads.lm_head).count();
    format!(
        "ds4-chat bench: ctx {frontier}: dspark draft pass {:.3} ms (median of {}), decode step {:.3} ms (median of {}): {:.1}% of a step; reads {:.3} GB a pass (median; {:.1}% of a step's {:.3} GB; distinct experts a stage {}; LM head in {lm} of {} passes)",
        pass * 1e3,
        passes.len(),
        step * 1e3,
        steps.len(),
        if step > 0.0 { 100.0 * pass / step } else { 0.0 },
        bytes / 1e9,
        100.0 * bytes / step_bytes.max(1) as f64,
        step_bytes as f64 / 1e9,
        experts.join("/"),
        passes.len()
    )
}

/// Streaming read bandwidth of this machine's memory in GB/s (sum over a 1 GiB buffer, all cores).
fn measure_host_read_gbps() -> f64 {
    use rayon::prelude::*;
    let words = (1usize << 30) / 8;
    let buf: Vec<u64> = (0..words as u64).into_par_iter().collect();
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let s: u64 = buf
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, &b| a.wrapping_add(b)))
            .sum();
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(s);
        best = best.max((words * 8) as f64 / secs / 1e9);
    }
    best
}

/// Peak bandwidth of the GPU a backend named `name` runs on: (GB/s, bytes per probe copy).
#[cfg(feature = "hip")]
fn measure_device_gbps(name: &str) -> Result<(f64, u64), String> {
    if name != "hip" {
        return Err(format!("no bandwidth probe for the {name} backend"));
    }
    let ctx = crate::backend::hip::HipContext::new().map_err(|e| e.to_string())?;
    crate::backend::hip::bandwidth::measure_copy_gbps(&ctx)
}

#[cfg(not(feature = "hip"))]
fn measure_device_gbps(name: &str) -> Result<(f64, u64), String> {
    Err(format!("no bandwidth probe for the {name} backend in this build"))
}

pub fn run(args: Args) -> CliResult {
    if args.ctx_start == 0 || args.ctx_start > args.ctx_max {
        return Err(format!(
            "--ctx-start {} must be in 1..=--ctx-max {}",
            args.ctx_start, args.ctx_max
        ));
    }
    // The cache holds the last frontier and the tokens decoded after it.
    let ctx_alloc = args.ctx_max.saturating_add(args.gen_tokens).saturating_add(1);
    let ctx_alloc = i64::try_from(ctx_alloc).unwrap_or(i64::MAX);
    let check_ctx_alloc = |model_ctx| {
        named(
            "--ctx-max + --gen-tokens",
            settings::check_ctx(ctx_alloc, settings::MIN_CLI_CTX, model_ctx),
        )
        .map(|c| c as usize)
    };
    check_ctx_alloc(None)?;
    let mut config = args.config.load(super::Config::default())?;
    args.placement.apply(&mut config)?;
    let placement = super::placement_of(&config);
    let speculate = config.speculate;
    let dspark_settings = config.dspark.clone();
    if let Some(n) = args.verify_cost.iter().find(|&&n| !(2..=MAX_VERIFY_BLOCK).contains(&n)) {
        return Err(format!(
            "--verify-cost: a block of {n} tokens is not in 2..={MAX_VERIFY_BLOCK}"
        ));
    }
    if let Some(a) = args.replay_acceptance.iter().find(|a| !(0.0..=1.0).contains(*a)) {
        return Err(format!("--replay-acceptance: {a} is not between 0 and 1"));
    }
    if let Some(p) = args.peak_gbps
        && !(p.is_finite() && p > 0.0)
    {
        return Err(format!("--peak-gbps: {p} is not a positive bandwidth"));
    }
    let model = Arc::new(Model::open(&args.model).map_err(|e| e.to_string())?);
    let ctx_alloc = check_ctx_alloc(Some(model.hp.context_length))?;
    // The tokenizer is only needed for --prompt-file (and to skip EOS while decoding).
    let tok = Tokenizer::from_gguf(&model.file);
    let per_token_bytes = weight_bytes_per_token(&model.hp, &table_from_model(&model));
    let per_token = per_token_bytes.total();
    let prompt = match &args.prompt_file {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            let tok = tok
                .as_ref()
                .map_err(|e| format!("--prompt-file needs the model's tokenizer: {e}"))?;
            let ids = tok.encode_plain(&text);
            if ids.len() < args.ctx_max {
                return Err(format!(
                    "{}: prompt has {} tokens, need at least --ctx-max={}",
                    p.display(),
                    ids.len(),
                    args.ctx_max
                ));
            }
            ids
        }
        None => synthetic_tokens(tok.as_ref().ok(), model.hp.n_vocab, args.ctx_max),
    };
    let t_open = Instant::now();
    let opened = open_device_model(model.clone(), &placement, ctx_alloc)?;
    let open_secs = t_open.elapsed().as_secs_f64();
    if let Some(why) = &opened.fallback_reason {
        eprintln!("ds4-chat bench: using the CPU backend: {why}");
    }
    let mut backend: Box<dyn DeviceSession> = opened.session;
    // The DSpark drafter is attached before the first prefill, so it reads every target row; it
    // drafts at every frontier.
    // Its passes are logged, to report their cost beside a plain step.
    let mut dspark_log: Option<(PassLog, Arc<DsparkModel>)> = None;
    let mut dspark = match speculate {
        crate::engine::speculate::Speculate::Dspark => {
            let mut opened = dspark_settings.open_drafter(&model, backend.as_mut(), ctx_alloc)?;
            if let Some(w) = &opened.warning {
                eprintln!("ds4-chat bench: {w}");
            }
            dspark_log = Some((opened.drafter.log_passes(), opened.support));
            Some(Box::new(opened.drafter) as Box<dyn Drafter>)
        }
        _ => None,
    };
    let lm_head_bytes = model.file.tensor("output.weight").map_or(0, |t| t.nbytes);
    match backend.weights_placement() {
        Some(p) => eprintln!(
            "ds4-chat bench: weights {}; backend ready in {open_secs:.2} s",
            p.summary()
        ),
        None => eprintln!("ds4-chat bench: weights mapped from the file (host); backend ready in {open_secs:.2} s"),
    }
    let (peak, peak_src) = match args.peak_gbps {
        Some(p) => (p, "given".to_string()),
        None if backend.name() == "cpu" => (measure_host_read_gbps(), "measured host read".to_string()),
        None => match measure_device_gbps(backend.name()) {
            Ok((gbps, bytes)) => (
                gbps,
                format!("measured device copy of {} MiB, read + written", bytes >> 20),
            ),
            Err(e) => (0.0, format!("unknown: {e}; pass --peak-gbps")),
        },
    };
    eprintln!(
        "ds4-chat bench: backend {} ({}{}), ctx {}, weight bytes per decoded token {} ({:.2} GiB), peak {:.1} GB/s ({})",
        backend.name(),
        backend.device_name(),
        backend
            .arithmetic()
            .map(|a| format!(", {a} arithmetic"))
            .unwrap_or_default(),
        ctx_alloc,
        per_token,
        per_token as f64 / (1u64 << 30) as f64,
        peak,
        peak_src
    );
    // Every tuning and diagnostic variable set, so a CSV can be reproduced (docs/configuration.md).
    let knobs = crate::backend::knobs::non_default();
    eprintln!(
        "knobs: {}",
        if knobs.is_empty() {
            "none (all defaults)".to_string()
        } else {
            knobs.join(" ")
        }
    );
    let eos = tok.as_ref().map_or(u32::MAX, |t| t.specials().eos);
    let mut out: Box<dyn Write> = match &args.csv {
        Some(p) => Box::new(std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?),
        None => Box::new(std::io::stdout()),
    };
    writeln!(out, "{CSV_HEADER}").map_err(|e| e.to_string())?;
    let mut previous = 0usize;
    for frontier in frontiers(args.ctx_start, args.ctx_max, args.step_incr) {
        let t = Instant::now();
        backend
            .eval(&prompt[previous..frontier], &mut |_, _| true)
            .map_err(|e| e.to_string())?;
        let prefill_secs = t.elapsed().as_secs_f64();
        let snapshot = backend.save_state();
        let limits = Limits {
            max_new: args.gen_tokens,
            stop_token: None,
            decode_last: true,
        };
        let t = Instant::now();
        let history = &prompt[..frontier];
        let mut spec = dspark
            .take()
            .or_else(|| speculate.drafter())
            .map(|d| Speculation::new(d, history));
        let mut hooks = GreedyPastEos { eos, out: Vec::new() };
        match spec.as_mut() {
            Some(spec) => generate_speculative(backend.as_mut(), limits, &mut hooks, spec),
            None => generate(backend.as_mut(), limits, &mut hooks),
        }
        .map_err(|e| e.to_string())?;
        let gen_secs = t.elapsed().as_secs_f64();
        let figures = spec.as_ref().map(|s| s.figures);
        if speculate == crate::engine::speculate::Speculate::Dspark {
            dspark = spec.map(|s| s.into_drafter());
        }
        if let Some(f) = figures {
            eprintln!(
                "ds4-chat bench: ctx {frontier}: speculate {}: {} cycles, {} drafted, {} accepted, {:.2} tokens per cycle",
                speculate.name(),
                f.cycles,
                f.drafted,
                f.accepted,
                f.tokens_per_cycle()
            );
        }
        backend.load_state(&snapshot).map_err(|e| e.to_string())?;
        // With DSpark, plain decode steps from the same frontier, timed one by one, after the
        // speculative run (restoring the state drops the captured rows the drafter reads).
        if let Some((log, support)) = &dspark_log {
            let passes = log.take();
            let bytes: Vec<u64> = passes
                .iter()
                .map(|p| pass_bytes(&support.stages, lm_head_bytes, &p.reads).total())
                .collect();
            let mut timed = TimedSteps {
                inner: GreedyPastEos { eos, out: Vec::new() },
                last: Instant::now(),
                steps: Vec::new(),
            };
            let plain = Limits {
                max_new: TIMED_STEPS.min(args.gen_tokens).max(1),
                ..limits
            };
            generate(backend.as_mut(), plain, &mut timed).map_err(|e| e.to_string())?;
            backend.load_state(&snapshot).map_err(|e| e.to_string())?;
            eprintln!(
                "{}",
                draft_cost_line(frontier, &passes, &bytes, &timed.steps, per_token)
            );
        }
        let plain_tps = (speculate == crate::engine::speculate::Speculate::Off)
            .then(|| args.gen_tokens as f64 / gen_secs.max(1e-9));
        let at = Frontier {
            frontier,
            history,
            continuation: &hooks.out,
            snapshot: &snapshot,
            eos,
        };
        for &n in &args.verify_cost {
            let cost = measure_verify(backend.as_mut(), &at, n)?;
            let bytes =
                per_token_bytes.total() - per_token_bytes.routed_experts + n as u64 * per_token_bytes.routed_experts;
            eprintln!(
                "ds4-chat bench: ctx {frontier}: verify of {n} tokens {:.3} ms = {:.2} decode steps ({:.3} ms); weight bytes per block <= {:.2} GiB ({:.2} per token)",
                1e3 * cost.verify_secs,
                cost.verify_secs / cost.step_secs,
                1e3 * cost.step_secs,
                bytes as f64 / (1u64 << 30) as f64,
                bytes as f64 / n as f64 / (1u64 << 30) as f64,
            );
        }
        if !args.replay_acceptance.is_empty() {
            let plain = match plain_tps {
                Some(tps) => tps,
                None => replay_run(backend.as_mut(), &at, None, args.gen_tokens, model.hp.n_vocab)?.0,
            };
            for &a in &args.replay_acceptance {
                let (tps, f, same) = replay_run(backend.as_mut(), &at, Some(a), args.gen_tokens, model.hp.n_vocab)?;
                eprintln!(
                    "ds4-chat bench: ctx {frontier}: replay acceptance {a}: {:.2}x plain ({tps:.2} vs {plain:.2} t/s), {} cycles, {} drafted, {} accepted, {:.2} tokens per cycle; {same} of {} tokens equal plain decode's",
                    tps / plain,
                    f.cycles,
                    f.drafted,
                    f.accepted,
                    f.tokens_per_cycle(),
                    at.continuation.len()
                );
            }
        }
        let row = BenchRow {
            ctx_tokens: frontier,
            prefill_tokens: frontier - previous,
            prefill_tps: (frontier - previous) as f64 / prefill_secs.max(1e-9),
            gen_tokens: args.gen_tokens,
            gen_tps: args.gen_tokens as f64 / gen_secs.max(1e-9),
            kvcache_bytes: snapshot.len() as u64,
        };
        writeln!(out, "{}", row.csv(per_token, peak)).map_err(|e| e.to_string())?;
        out.flush().map_err(|e| e.to_string())?;
        previous = frontier;
    }
    Ok(())
}

/// The longest block `--verify-cost` takes (the GPU's verify pass, `backend::hip::block`).
const MAX_VERIFY_BLOCK: usize = 8;

/// Timed repetitions of a verify and of a decode step (the medians are reported).
const VERIFY_REPS: usize = 9;

/// What the speculative measurements at one frontier start from.
struct Frontier<'a> {
    frontier: usize,
    history: &'a [u32],
    /// The plain run's tokens after the frontier.
    continuation: &'a [u32],
    snapshot: &'a [u8],
    eos: u32,
}

/// Median wall times of a verify of n tokens and of a decode step at a frontier.
struct VerifyCost {
    verify_secs: f64,
    step_secs: f64,
}

/// Time `VERIFY_REPS` verifies of the block [next token, n − 1 continuation tokens] (each rolled
/// back by `commit(0)`, not timed) and as many single decode steps from the frontier's state.
fn measure_verify(backend: &mut dyn DeviceSession, at: &Frontier, n: usize) -> Result<VerifyCost, String> {
    if !backend.has_block_verify() {
        return Err(format!(
            "--verify-cost: the {} backend has no block verify",
            backend.name()
        ));
    }
    let e = |e: BackendError| e.to_string();
    let mut block: Vec<u32> = at.continuation.iter().copied().take(n).collect();
    block.resize(n, at.history.last().copied().unwrap_or(0));
    let mut verify = Vec::new();
    let mut step = Vec::new();
    for _ in 0..VERIFY_REPS {
        backend.load_state(at.snapshot).map_err(e)?;
        let t = Instant::now();
        backend.verify(&block).map_err(e)?;
        verify.push(t.elapsed().as_secs_f64());
        backend.commit(0).map_err(e)?;
        let t = Instant::now();
        backend.eval(&block[..1], &mut |_, _| true).map_err(e)?;
        step.push(t.elapsed().as_secs_f64());
    }
    backend.load_state(at.snapshot).map_err(e)?;
    Ok(VerifyCost {
        verify_secs: median(&verify),
        step_secs: median(&step),
    })
}

/// Decode `gen` tokens from the frontier with the replay drafter at `acceptance` (plain decode for
/// `None`): tokens per second, the speculation figures, and how many of the tokens handed out, from
/// the first, equal the plain run's continuation (all of them in exact arithmetic, where a block's
/// logits are bit for bit those of single steps: docs/speculative.md#measuring).
fn replay_run(
    backend: &mut dyn DeviceSession,
    at: &Frontier,
    acceptance: Option<f64>,
    n_gen: usize,
    n_vocab: usize,
) -> Result<(f64, crate::engine::generate::SpeculationFigures, usize), String> {
    use crate::engine::speculate::replay::ReplayDrafter;
    backend.load_state(at.snapshot).map_err(|e| e.to_string())?;
    let limits = Limits {
        max_new: n_gen,
        stop_token: None,
        decode_last: true,
    };
    let mut hooks = GreedyPastEos {
        eos: at.eos,
        out: Vec::new(),
    };
    let t = Instant::now();
    let figures = match acceptance {
        None => {
            generate(backend, limits, &mut hooks).map_err(|e| e.to_string())?;
            Default::default()
        }
        Some(a) => {
            let seed = 0x5eed ^ at.frontier as u64;
            let drafter = ReplayDrafter::new(at.frontier, at.continuation.to_vec(), a, n_vocab as u32, seed)?;
            let mut spec = Speculation::new(Box::new(drafter), at.history);
            generate_speculative(backend, limits, &mut hooks, &mut spec).map_err(|e| e.to_string())?;
            spec.figures
        }
    };
    let secs = t.elapsed().as_secs_f64();
    backend.load_state(at.snapshot).map_err(|e| e.to_string())?;
    let same = hooks
        .out
        .iter()
        .zip(at.continuation)
        .take_while(|(a, b)| a == b)
        .count();
    Ok((n_gen as f64 / secs.max(1e-9), figures, same))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frontiers_end_exactly_at_max() {
        assert_eq!(frontiers(2048, 8192, 2048), vec![2048, 4096, 6144, 8192]);
        assert_eq!(frontiers(100, 250, 100), vec![100, 200, 250]);
        assert_eq!(frontiers(64, 64, 10), vec![64]);
    }

    #[test]
    fn csv_row_reports_bandwidth_fraction() {
        let row = BenchRow {
            ctx_tokens: 2048,
            prefill_tokens: 2048,
            prefill_tps: 1000.0,
            gen_tokens: 64,
            gen_tps: 50.0,
            kvcache_bytes: 123,
        };
        // 9.56e9 B/token × 50 t/s = 478 GB/s = 9.96% of 4800 GB/s.
        assert_eq!(
            row.csv(9_560_000_000, 4800.0),
            "2048,2048,1000.00,64,50.00,123,9560000000,478.0,9.96"
        );
        assert_eq!(CSV_HEADER.split(',').count(), row.csv(1, 1.0).split(',').count());
    }

    #[test]
    fn draft_cost_is_the_median_pass_against_the_median_step() {
        use crate::model::dspark::PassReads;
        let pass = |secs: f64, experts: Vec<usize>, lm_head: bool| DraftPass {
            secs,
            reads: PassReads {
                experts,
                lm_head,
                markov_rows: 0,
                confidence_rows: 1,
            },
        };
        let passes = [
            pass(0.004, vec![20, 26, 28], true),
            pass(0.002, vec![22, 24, 28], false),
            pass(0.003, vec![24, 28, 28], true),
        ];
        // Median pass 3 ms against the median step (of 10, 20, 30, 40 ms: (20 + 30) / 2 = 25 ms):
        // 12%; median bytes 1.8e9 of 9e9 a step: 20%.
        let line = draft_cost_line(
            2048,
            &passes,
            &[1_700_000_000, 1_800_000_000, 1_900_000_000],
            &[0.010, 0.040, 0.030, 0.020],
            9_000_000_000,
        );
        assert_eq!(
            line,
            "ds4-chat bench: ctx 2048: dspark draft pass 3.000 ms (median of 3), decode step 25.000 ms (median of 4): 12.0% of a step; reads 1.800 GB a pass (median; 20.0% of a step's 9.000 GB; distinct experts a stage 22.0/26.0/28.0; LM head in 2 of 3 passes)"
        );
        assert_eq!(
            draft_cost_line(64, &[], &[], &[0.01], 1),
            "ds4-chat bench: ctx 64: dspark ran no draft pass"
        );
    }

    #[test]
    fn argmax_skips_the_excluded_token() {
        assert_eq!(argmax_excluding(&[0.0, 5.0, 3.0], 1), 2);
        assert_eq!(argmax_excluding(&[0.0, 5.0, 3.0], 0), 1);
    }
}
