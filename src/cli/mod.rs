//! Subcommand implementations: one file per subcommand, each with its clap `Args` and `run`.
//!
//! Owns argument parsing and printing, and the diagnostics that need every layer (`selftest
//! --forward`). The top layer (src/lib.rs): nothing imports it. Must not hold engine logic: it calls
//! `engine::`, `backend::`, `model::` and `gguf::`.

pub mod bench;
pub mod chat;
pub mod doctor;
pub mod gen_model;
pub mod inspect;
pub mod run;
pub mod score;
pub mod selftest;
pub mod serve;
pub mod tokenize;

/// Error type of every subcommand: a one-line message.
pub type CliResult = Result<(), String>;

/// The command line of the `ds4-chat` binary (here rather than in main.rs so that tests can walk
/// every flag through `clap::CommandFactory`, e.g. docs/configuration.md's check).
#[derive(clap::Parser, Debug)]
#[command(
    name = "ds4-chat",
    version,
    about = "Chat with DeepSeek V4 Flash (ds4 GGUF) in the terminal"
)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Option<Cmd>,
    #[command(flatten)]
    pub chat: chat::Args,
}

#[derive(clap::Subcommand, Debug)]
pub enum Cmd {
    /// Print a model file's architecture, hyperparameters and byte accounting.
    Inspect(inspect::Args),
    /// Check that this machine is ready to run the model on its GPU (one line per check, exit 0 when ready).
    Doctor(doctor::Args),
    /// Write a synthetic ds4-layout GGUF with deterministic random weights.
    GenModel(gen_model::Args),
    /// Tokenize text with the model's tokenizer.
    Tokenize(tokenize::Args),
    /// Generate an answer headlessly (stdout), optionally dumping logprobs.
    Run(run::Args),
    /// Teacher-forced scoring of a token sequence (JSON).
    Score(score::Args),
    /// Measure prefill and decode speed (CSV).
    Bench(bench::Args),
    /// Check the GPU kernels and the engine against the CPU reference.
    Selftest(selftest::Args),
    /// Serve the model over an OpenAI-compatible HTTP API (chat completions, streaming).
    Serve(serve::Args),
}

/// Runs the parsed command line: the environment variables are checked first (a malformed one is
/// the one-line error, before anything loads), then the subcommand, or the chat app without one.
pub fn dispatch(args: Cli) -> CliResult {
    crate::backend::knobs::validate()?;
    match args.cmd {
        Some(Cmd::Inspect(a)) => inspect::run(a),
        Some(Cmd::Doctor(a)) => doctor::run(a),
        Some(Cmd::GenModel(a)) => gen_model::run(a),
        Some(Cmd::Tokenize(a)) => tokenize::run(a),
        Some(Cmd::Run(a)) => run::run(a),
        Some(Cmd::Score(a)) => score::run(a),
        Some(Cmd::Bench(a)) => bench::run(a),
        Some(Cmd::Selftest(a)) => selftest::run(a),
        Some(Cmd::Serve(a)) => serve::run(a),
        None => chat::run(args.chat),
    }
}

/// The `--exact` flag of the app, `run`, `score`, `bench` and `selftest`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ArithmeticArgs {
    /// GPU kernels in exact arithmetic, bit for bit equal to the CPU engine (default: fast).
    #[arg(long)]
    pub exact: bool,
}

impl ArithmeticArgs {
    /// The arithmetic the flag asks for, `None` when it was not given (the config decides).
    pub fn requested(&self) -> Option<crate::backend::arithmetic::Arithmetic> {
        self.exact.then_some(crate::backend::arithmetic::Arithmetic::Exact)
    }

    /// The arithmetic to run: exact when asked for, else fast.
    pub fn arithmetic(&self) -> crate::backend::arithmetic::Arithmetic {
        self.requested().unwrap_or_default()
    }
}

/// The config file flag of the app, `run`, `serve` and `bench`: the user settings are loaded once
/// from it (docs/configuration.md), then each subcommand's flags are applied on top.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ConfigArg {
    /// Config file (default: the path printed by `ds4-chat --print-config`; a missing file is the
    /// defaults).
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
}

impl ConfigArg {
    /// The file to read: `--config`, else the platform's config path (`None` without a home).
    pub fn path(&self) -> Option<std::path::PathBuf> {
        self.config.clone().or_else(crate::tui::config::config_path)
    }

    /// The settings of the file over `base` (a subcommand's defaults); the error names the file.
    pub fn load(&self, base: Config) -> Result<Config, String> {
        match self.path() {
            Some(p) => crate::tui::config::load_over(&p, base),
            None => Ok(base),
        }
    }
}

/// The one settings value of a run: the config file's keys over the defaults, the flags over both.
pub use crate::tui::config::Config;

/// Where and how the engine runs: `--threads`, `--backend`, `--weights`, `--speculate`, the DSpark
/// drafter's `--dspark`, `--dspark-confidence`, `--dspark-convention` and `--exact` of the app, `run`,
/// `serve` and `bench` (config keys `threads`, `backend`, `weights`, `speculate`, `dspark`,
/// `dspark_confidence`, `dspark_convention`, `arithmetic`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PlacementArgs {
    /// CPU threads, 0 = all cores [default: 0].
    #[arg(short = 't', long, value_name = "N", allow_negative_numbers = true)]
    pub threads: Option<i64>,
    /// auto (GPU when usable, else CPU), hip or cpu [default: auto].
    #[arg(long, value_name = "auto|hip|cpu")]
    pub backend: Option<String>,
    /// GPU weight placement: auto (copy when device memory holds the weights, else map), copy or map
    /// [default: auto].
    #[arg(long, value_name = "auto|copy|map")]
    pub weights: Option<String>,
    /// Speculative decoding: off (plain decode), ngram (prompt lookup drafts, checked in one block
    /// verify; plain decode where the backend has none) or dspark (DeepSeek's drafter from the
    /// support file) [default: off].
    #[arg(long, value_name = "off|ngram|dspark")]
    pub speculate: Option<String>,
    /// How drafts are accepted when sampling: exact (the sampler's distribution) or opportunistic
    /// (drafts kept while they equal the argmax, as ds4 does) [default: exact].
    #[arg(long, value_name = "exact|opportunistic")]
    pub speculate_sampling: Option<String>,
    /// The DSpark support file [default: DeepSeek-V4-Flash-DSpark-support-0731.gguf next to the model].
    #[arg(long, value_name = "FILE")]
    pub dspark: Option<std::path::PathBuf>,
    /// The confidence every DSpark draft must reach (0 ..= 1; 0 drafts whole blocks) [default: 0.7].
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub dspark_confidence: Option<f64>,
    /// Where DeepSeek's reference and ds4 differ, which DSpark follows: reference or ds4 [default:
    /// reference].
    #[arg(long, value_name = "reference|ds4")]
    pub dspark_convention: Option<String>,
    #[command(flatten)]
    pub arithmetic: ArithmeticArgs,
}

/// [`PlacementArgs`] after the range checks.
pub use crate::engine::backend_open::PlacementRequest;

impl PlacementArgs {
    /// The flags given, applied over `c`; the error is one line naming the flag.
    pub fn apply(&self, c: &mut Config) -> Result<(), String> {
        use crate::engine::settings::{self, named};
        if let Some(v) = self.threads {
            c.threads = named("--threads", settings::check_threads(v))?;
        }
        if let Some(v) = &self.backend {
            c.backend = named("--backend", settings::parse_backend(v))?;
        }
        if let Some(v) = &self.weights {
            c.weights = named("--weights", settings::parse_weights(v))?;
        }
        if let Some(v) = &self.speculate {
            c.speculate = named("--speculate", crate::engine::speculate::Speculate::parse(v))?;
        }
        if let Some(v) = &self.speculate_sampling {
            let rule = crate::engine::speculate::accept::SamplingRule::parse(v);
            c.speculate_sampling = named("--speculate-sampling", rule)?;
        }
        if let Some(v) = &self.dspark {
            c.dspark.path = Some(v.clone());
        }
        if let Some(v) = self.dspark_confidence {
            c.dspark.confidence = named(
                "--dspark-confidence",
                crate::engine::speculate::dspark::check_confidence(v),
            )?;
        }
        if let Some(v) = &self.dspark_convention {
            c.dspark.convention = named("--dspark-convention", crate::model::dspark::DsparkConvention::parse(v))?;
        }
        if let Some(mode) = self.arithmetic.requested() {
            c.arithmetic = mode;
        }
        Ok(())
    }

    /// The placement of `base` with the flags applied (the subcommands that keep no other setting).
    pub fn checked(&self, mut base: Config) -> Result<PlacementRequest, String> {
        self.apply(&mut base)?;
        Ok(placement_of(&base))
    }
}

/// Where `c` runs the engine.
pub fn placement_of(c: &Config) -> PlacementRequest {
    PlacementRequest {
        threads: c.threads,
        backend: c.backend,
        weights: c.weights,
        arithmetic: c.arithmetic,
    }
}

/// What to generate: the system prompt, the sampler and the answer's length, for the app and `run`
/// (config keys `system`, `temp`, `top_p`, `top_k`, `min_p`, `seed`, `max_tokens`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct GenerationArgs {
    /// System prompt ("" for none) [default: ds4's, "You are a helpful assistant"].
    #[arg(long = "system", visible_alias = "sys", value_name = "TEXT")]
    pub system: Option<String>,
    /// Temperature (0 ..= 10); 0 is greedy [default: 1].
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub temp: Option<f64>,
    /// Nucleus mass (0 < top_p <= 1) [default: 1].
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub top_p: Option<f64>,
    /// Candidates kept (0 ..= 1024); 0 disables top-k [default: 0].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub top_k: Option<i64>,
    /// Minimum probability relative to the top token (0 ..= 1) [default: 0.05].
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub min_p: Option<f64>,
    /// Sampler seed [default: from the clock and pid].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub seed: Option<i64>,
    /// Most tokens per answer [default: 16384 in the app, 50000 for `run`].
    #[arg(short = 'n', long, value_name = "N", allow_negative_numbers = true)]
    pub max_tokens: Option<i64>,
}

impl GenerationArgs {
    /// The flags given, applied over `c`; the error is one line naming the flag.
    pub fn apply(&self, c: &mut Config) -> Result<(), String> {
        use crate::engine::settings::{self, named};
        if let Some(v) = &self.system {
            c.system = v.clone();
        }
        if let Some(v) = self.temp {
            c.sampling.temperature = named("--temp", settings::check_temp(v))?;
        }
        if let Some(v) = self.top_p {
            c.sampling.top_p = named("--top-p", settings::check_top_p(v))?;
        }
        if let Some(v) = self.top_k {
            c.sampling.top_k = named("--top-k", settings::check_top_k(v))?;
        }
        if let Some(v) = self.min_p {
            c.sampling.min_p = named("--min-p", settings::check_min_p(v))?;
        }
        if let Some(v) = self.seed {
            c.sampling.seed = Some(named("--seed", settings::check_seed(v))?);
        }
        if let Some(v) = self.max_tokens {
            c.max_tokens = named("--max-tokens", settings::check_max_tokens(v))?;
        }
        Ok(())
    }
}

/// `--ctx` of the headless subcommands over `c.ctx`: `MIN_CLI_CTX ..= MAX_CTX` (the app's own
/// `--ctx` keeps the app's minimum).
pub fn apply_cli_ctx(ctx: Option<i64>, c: &mut Config) -> Result<(), String> {
    use crate::engine::settings::{self, named};
    if let Some(v) = ctx {
        c.ctx = named("--ctx", settings::check_ctx(v, settings::MIN_CLI_CTX, None))?;
    }
    Ok(())
}

/// The reasoning-mode flags shared by the chat app and `run` (docs/prompt.md#think-modes).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ThinkArgs {
    /// No reasoning: the prompt ends with `</think>`.
    #[arg(long, conflicts_with_all = ["think", "think_max"])]
    pub nothink: bool,
    /// Reasoning (high): the prompt ends with `<think>`.
    #[arg(long, conflicts_with = "think_max")]
    pub think: bool,
    /// Maximum reasoning effort (needs --ctx >= 393216, else plain thinking).
    #[arg(long)]
    pub think_max: bool,
}

impl ThinkArgs {
    /// The flag given, applied over `c` (config key `think`).
    pub fn apply(&self, c: &mut Config) {
        if let Some(mode) = self.requested() {
            c.think = mode;
        }
    }

    /// The mode the flags ask for, `None` when no flag was given.
    pub fn requested(&self) -> Option<crate::model::chat::ThinkMode> {
        use crate::model::chat::ThinkMode;
        if self.nothink {
            Some(ThinkMode::Off)
        } else if self.think_max {
            Some(ThinkMode::Max)
        } else if self.think {
            Some(ThinkMode::High)
        } else {
            None
        }
    }
}
