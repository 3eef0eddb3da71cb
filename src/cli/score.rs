//! `ds4-chat score` (placeholder until its issue lands).

use super::CliResult;

#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> CliResult {
    Err("'score' is not implemented yet".into())
}
