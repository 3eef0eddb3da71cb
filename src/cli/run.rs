//! `ds4-chat run`: one-shot headless generation (spec §6.1, §6.4, §7), like ds4's CLI with `-p`.
//!
//! Renders the one-shot prompt (or takes raw ids), prefills, then samples and streams the answer to
//! stdout (reasoning to stderr) until EOS, `-n`, or the context is full. `--dump-logprobs` instead
//! writes ds4's greedy logprob dump (§7.3). Owns argument handling and printing only.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::CliResult;
use crate::backend::Backend;
use crate::model::weights::Model;

/// Which backend `run`/`score` execute on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    Cpu,
    Hip,
}

/// Open and bind a model file; the error is one line naming the file.
pub fn open_model(path: &Path) -> Result<Arc<Model>, String> {
    Model::open(path).map(Arc::new).map_err(|e| e.to_string())
}

/// A backend session for `model` with a cache of `ctx` tokens.
pub fn open_backend(
    model: Arc<Model>,
    ctx: usize,
    threads: usize,
    which: BackendArg,
) -> Result<Box<dyn Backend>, String> {
    let _ = (&model, ctx, threads);
    match which {
        BackendArg::Cpu => Err("the CPU engine is not part of this build yet".into()),
        BackendArg::Hip => Err("--backend hip: the HIP backend is not wired into `run`/`score` yet".into()),
    }
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model file (ds4 GGUF).
    #[arg(short = 'm', long)]
    pub model: PathBuf,
    /// Prompt text (a user message; if it starts with the BOS string it is taken as fully rendered).
    #[arg(short = 'p', long)]
    pub prompt: Option<String>,
    /// Feed these comma-separated token ids instead of a rendered prompt.
    #[arg(long, value_delimiter = ',', num_args = 1.., conflicts_with = "prompt")]
    pub tokens: Option<Vec<u32>>,
    /// System prompt ("" for none).
    #[arg(
        long = "system",
        visible_alias = "sys",
        default_value = "You are a helpful assistant"
    )]
    pub system: String,
    /// No reasoning: the prompt ends with `</think>`.
    #[arg(long, conflicts_with_all = ["think", "think_max"])]
    pub nothink: bool,
    /// Reasoning (the default): the prompt ends with `<think>`.
    #[arg(long, conflicts_with = "think_max")]
    pub think: bool,
    /// Maximum reasoning effort (needs --ctx >= 393216, else plain thinking).
    #[arg(long)]
    pub think_max: bool,
    /// Most tokens to generate.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 50000)]
    pub max_tokens: usize,
    /// Temperature; 0 or below is greedy.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub temp: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// 0 disables top-k.
    #[arg(long, default_value_t = 0)]
    pub top_k: u32,
    /// Minimum probability relative to the top token.
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Sampler seed (default: from the clock and pid).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Context size in tokens.
    #[arg(short = 'c', long, default_value_t = 32768)]
    pub ctx: usize,
    /// Write ds4's greedy logprob dump (JSON) here instead of sampling.
    #[arg(long)]
    pub dump_logprobs: Option<PathBuf>,
    /// Entries per step in the dump (at most 128).
    #[arg(long, default_value_t = 20)]
    pub logprobs_top_k: usize,
    /// CPU threads (0 = all cores).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    #[arg(long, value_enum, default_value_t = BackendArg::Cpu)]
    pub backend: BackendArg,
}

pub fn run(args: Args) -> CliResult {
    let _ = (Instant::now(), std::io::stdout().flush());
    let _ = args;
    Err("'run' needs the tokenizer; not wired yet".into())
}
