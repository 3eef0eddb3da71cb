//! `ds4-chat run` (placeholder until its issue lands).

use super::CliResult;

#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> CliResult {
    Err("'run' is not implemented yet".into())
}
