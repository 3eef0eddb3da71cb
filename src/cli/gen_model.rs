//! `ds4-chat gen-model` (placeholder until its issue lands).

use super::CliResult;

#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> CliResult {
    Err("'gen-model' is not implemented yet".into())
}
