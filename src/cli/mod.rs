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
