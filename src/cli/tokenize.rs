//! `ds4-chat tokenize` (placeholder until its issue lands).

use super::CliResult;

#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> CliResult {
    Err("'tokenize' is not implemented yet".into())
}
