//! The `cannon` command line: `doctor`, `data`, `verify` (see [`cannon_trainer::cli`]);
//! `train`, `bench` and `export` arrive with their issues.
fn main() -> std::process::ExitCode {
    cannon_trainer::cli::main()
}
