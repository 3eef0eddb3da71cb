//! `ds4-chat bench` (placeholder until its issue lands).

use super::CliResult;

#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> CliResult {
    Err("'bench' is not implemented yet".into())
}
