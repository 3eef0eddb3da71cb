//! Subcommand implementations: one file per subcommand, each with its clap `Args` and `run`.
//!
//! Owns argument parsing and printing. Must not hold engine logic: it calls `engine::`, `model::`
//! and `gguf::`.

pub mod bench;
pub mod chat;
pub mod gen_model;
pub mod inspect;
pub mod run;
pub mod score;
pub mod selftest;
pub mod tokenize;

/// Error type of every subcommand: a one-line message.
pub type CliResult = Result<(), String>;
