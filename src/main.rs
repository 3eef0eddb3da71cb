//! The `ds4-chat` binary: the TUI by default, plus headless subcommands.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use ds4_chat::cli;

#[derive(Parser, Debug)]
#[command(
    name = "ds4-chat",
    version,
    about = "Chat with DeepSeek V4 Flash (ds4 GGUF) in the terminal"
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    chat: cli::chat::Args,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print a model file's architecture, hyperparameters and byte accounting.
    Inspect(cli::inspect::Args),
    /// Check that this machine is ready to run the model on its GPU (one line per check, exit 0 when ready).
    Doctor(cli::doctor::Args),
    /// Write a synthetic ds4-layout GGUF with deterministic random weights.
    GenModel(cli::gen_model::Args),
    /// Tokenize text with the model's tokenizer.
    Tokenize(cli::tokenize::Args),
    /// Generate an answer headlessly (stdout), optionally dumping logprobs.
    Run(cli::run::Args),
    /// Teacher-forced scoring of a token sequence (JSON).
    Score(cli::score::Args),
    /// Measure prefill and decode speed (CSV).
    Bench(cli::bench::Args),
    /// Check the GPU kernels and the engine against the CPU reference.
    Selftest(cli::selftest::Args),
    /// Serve the model over an OpenAI-compatible HTTP API (chat completions, streaming).
    Serve(cli::serve::Args),
}

fn main() -> ExitCode {
    let args = Cli::parse();
    let result = match args.cmd {
        Some(Cmd::Inspect(a)) => cli::inspect::run(a),
        Some(Cmd::Doctor(a)) => cli::doctor::run(a),
        Some(Cmd::GenModel(a)) => cli::gen_model::run(a),
        Some(Cmd::Tokenize(a)) => cli::tokenize::run(a),
        Some(Cmd::Run(a)) => cli::run::run(a),
        Some(Cmd::Score(a)) => cli::score::run(a),
        Some(Cmd::Bench(a)) => cli::bench::run(a),
        Some(Cmd::Selftest(a)) => cli::selftest::run(a),
        Some(Cmd::Serve(a)) => cli::serve::run(a),
        None => cli::chat::run(args.chat),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ds4-chat: {e}");
            ExitCode::FAILURE
        }
    }
}
