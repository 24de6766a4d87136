//! The `cannon` command line (see [`cannon_trainer::app::cli`]).

/// Host allocations counted per thread, so that `cannon plan --measure` measures a rank's
/// host bytes as its device allocator measures its device bytes.
#[global_allocator]
static HOST: cannon_runtime::host_count::CountingAlloc = cannon_runtime::host_count::CountingAlloc;

fn main() -> std::process::ExitCode {
    cannon_trainer::app::cli::main()
}
