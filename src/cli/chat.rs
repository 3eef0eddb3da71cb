//! The default command: `ds4-chat MODEL.gguf` opens the TUI (placeholder until its issue lands).

use super::CliResult;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF model file.
    pub model: Option<std::path::PathBuf>,
    /// Run on a tiny generated model of the real architecture (random answers).
    #[arg(long)]
    pub demo: bool,
}

pub fn run(_args: Args) -> CliResult {
    Err("the TUI is not implemented yet".into())
}
