//! The `cannon` command line: train, verify, bench, data, export, doctor.
fn main() -> std::process::ExitCode {
    cannon_trainer::cli::main()
}
