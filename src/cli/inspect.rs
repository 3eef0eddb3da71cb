//! `ds4-chat inspect` (placeholder until its issue lands).

use super::CliResult;

#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> CliResult {
    Err("'inspect' is not implemented yet".into())
}
