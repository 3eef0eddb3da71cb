//! `ds4-chat score`: teacher-forced scoring of a token sequence, printed as one JSON object.
//!
//! Entry i is the next-token distribution after tokens[0..=i]. Two paths: `decode` feeds the tokens
//! one at a time into one cache (what generation does); `prefill` runs a fresh batched prefill of
//! tokens[0..=i] for every i (quadratic, meant for tiny models and for checking the batched path).
//! No sampling happens here.

use std::path::PathBuf;

use super::CliResult;
use crate::backend::WeightsMode;
use crate::backend::{BackendError, DeviceSession};
use crate::engine::logprobs::{self, ScoredPosition};
use crate::engine::settings::{self, named};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ScorePath {
    /// One batched prefill of tokens[0..=i] per position i.
    Prefill,
    /// Token-by-token decode, logits recorded after each token.
    Decode,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model file (ds4 GGUF).
    #[arg(short = 'm', long)]
    pub model: PathBuf,
    /// Comma-separated token ids, fed as they are (no BOS added, no template).
    #[arg(long, value_delimiter = ',', required = true, num_args = 1..)]
    pub tokens: Vec<u32>,
    /// Entries per position, highest logits first.
    #[arg(long, default_value_t = 20)]
    pub top_k: usize,
    #[arg(long, value_enum, default_value_t = ScorePath::Decode)]
    pub path: ScorePath,
    /// Context size (must exceed the number of tokens).
    #[arg(short = 'c', long, default_value_t = 4096, allow_negative_numbers = true)]
    pub ctx: i64,
    /// CPU threads (0 = all cores).
    #[arg(short = 't', long, default_value_t = 0, allow_negative_numbers = true)]
    pub threads: i64,
    /// auto (GPU when usable, else CPU), hip or cpu.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    #[command(flatten)]
    pub arithmetic: super::ArithmeticArgs,
}

/// Receives each position's index and next-token logits.
pub type PositionVisitor<'a> = &'a mut dyn FnMut(usize, &[f32]) -> Result<(), String>;

/// Evaluate `tokens` teacher-forced along `path` and hand `visit(i, logits)` the next-token logits
/// after tokens[0..=i], in order. Stops at the first error `visit` or the backend returns.
pub fn teacher_forced(
    backend: &mut dyn DeviceSession,
    tokens: &[u32],
    path: ScorePath,
    visit: PositionVisitor<'_>,
) -> Result<(), String> {
    let mut no_progress = |_: usize, _: usize| true;
    let eval = |b: &mut dyn DeviceSession, t: &[u32], p: &mut dyn FnMut(usize, usize) -> bool| {
        b.eval(t, p).map_err(|e: BackendError| e.to_string())
    };
    match path {
        ScorePath::Decode => {
            backend.reset();
            for (i, &t) in tokens.iter().enumerate() {
                eval(backend, &[t], &mut no_progress)?;
                visit(i, backend.logits())?;
            }
        }
        ScorePath::Prefill => {
            for i in 0..tokens.len() {
                backend.reset();
                eval(backend, &tokens[..=i], &mut no_progress)?;
                visit(i, backend.logits())?;
            }
        }
    }
    Ok(())
}

pub fn run(args: Args) -> CliResult {
    let ctx = named("--ctx", settings::check_ctx(args.ctx, settings::MIN_CLI_CTX, None))? as usize;
    let threads = named("--threads", settings::check_threads(args.threads))?;
    let backend = named("--backend", settings::parse_backend(&args.backend))?;
    if args.tokens.is_empty() {
        return Err("--tokens: give at least one token id".into());
    }
    if args.tokens.len() >= ctx {
        return Err(format!(
            "{} tokens do not fit a context of {ctx} (a sequence must be shorter than --ctx)",
            args.tokens.len(),
        ));
    }
    let model = super::run::open_model(&args.model)?;
    let n_vocab = model.hp.n_vocab;
    if let Some(&bad) = args.tokens.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(format!(
            "--tokens: id {bad} is outside the vocabulary (n_vocab {n_vocab})"
        ));
    }
    let at = super::PlacementRequest {
        threads,
        backend,
        weights: WeightsMode::Auto,
        arithmetic: args.arithmetic.arithmetic(),
    };
    let mut backend = super::run::open_device_session(model, &at, ctx)?;
    let k = args.top_k.min(n_vocab);
    let mut positions = Vec::with_capacity(args.tokens.len());
    teacher_forced(backend.as_mut(), &args.tokens, args.path, &mut |i, logits| {
        positions.push(ScoredPosition {
            pos: i,
            token: args.tokens[i],
            top: logprobs::top_logprobs(logits, k),
        });
        Ok(())
    })?;
    println!("{}", logprobs::score_json(n_vocab, &positions));
    Ok(())
}
