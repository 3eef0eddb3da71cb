//! `ds4-chat doctor [MODEL]`: is this machine ready to run the model on its GPU? One line per
//! check, each failing one with its fix; exit status 0 when ready, 1 otherwise. Runs without a
//! GPU too and then says what is missing.
//!
//! Owns the command line and the printing; the reading is `probe`, the verdicts `checks`.

pub mod checks;
pub mod probe;

use std::path::PathBuf;

use super::CliResult;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The model file to check (size, filesystem, page cache, which ds4 file it is).
    pub model: Option<PathBuf>,
    /// Context the KV cache is sized for (default: the config file's, else 32768).
    #[arg(long)]
    pub ctx: Option<u32>,
}

fn configured_ctx() -> u32 {
    crate::tui::config::config_path()
        .and_then(|p| crate::tui::config::load(&p).ok())
        .map_or(crate::tui::config::Config::default().ctx, |c| c.ctx)
}

/// The report lines and the exit status for `args` on the machine the environment points at.
pub fn report(args: &Args) -> (Vec<String>, i32) {
    let facts = probe::probe(
        &probe::Roots::from_env(),
        args.model.as_deref(),
        args.ctx.unwrap_or_else(configured_ctx),
    );
    let checks = checks::diagnose(&facts);
    (
        checks.iter().map(checks::Check::line).collect(),
        checks::exit_code(&checks),
    )
}

pub fn run(args: Args) -> CliResult {
    let (lines, code) = report(&args);
    for l in &lines {
        println!("{l}");
    }
    if code == 0 {
        println!("ready");
        Ok(())
    } else {
        Err(format!(
            "not ready: {} check(s) failed",
            lines.iter().filter(|l| l.starts_with("FAIL")).count()
        ))
    }
}
