//! Subcommand implementations: one file per subcommand, each with its clap `Args` and `run`.
//!
//! Owns argument parsing and printing. Must not hold engine logic: it calls `engine::`, `model::`
//! and `gguf::`.

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

/// Where the engine runs: `--threads`, `--backend`, `--weights` and `--exact` of `run`, `serve`
/// and `bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct PlacementArgs {
    /// CPU threads (0 = all cores).
    #[arg(short = 't', long, default_value_t = 0, allow_negative_numbers = true)]
    pub threads: i64,
    /// auto (GPU when usable, else CPU), hip or cpu.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// GPU weight placement: auto (copy when device memory holds the weights, else map), copy or map.
    #[arg(long, default_value = "auto")]
    pub weights: String,
    #[command(flatten)]
    pub arithmetic: ArithmeticArgs,
}

/// [`PlacementArgs`] after the range checks.
pub use crate::engine::backend_open::PlacementRequest;

impl PlacementArgs {
    /// Every flag checked; the error is one line naming the flag.
    pub fn checked(&self) -> Result<PlacementRequest, String> {
        use crate::engine::settings::{self, named};
        Ok(PlacementRequest {
            threads: named("--threads", settings::check_threads(self.threads))?,
            backend: named("--backend", settings::parse_backend(&self.backend))?,
            weights: named("--weights", settings::parse_weights(&self.weights))?,
            arithmetic: self.arithmetic.arithmetic(),
        })
    }
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
