//! The `ds4-chat` binary: the TUI by default, plus headless subcommands (`cli::Cli`).

use std::process::ExitCode;

use clap::Parser;

use ds4_chat::cli;

fn main() -> ExitCode {
    match cli::dispatch(cli::Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ds4-chat: {e}");
            ExitCode::FAILURE
        }
    }
}
