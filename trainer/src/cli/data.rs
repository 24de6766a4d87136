//! `cannon data ...`: make, inspect and check datasets.

use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct DataArgs {}

pub fn run(_args: DataArgs) -> ExitCode {
    eprintln!("cannon data: not built yet (see the data pipeline issue)");
    ExitCode::from(2)
}
