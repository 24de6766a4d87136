//! The `cannon` command line. Each subcommand lives in its own module with its own args struct.

pub(crate) mod bench;
pub(crate) mod compare;
pub(crate) mod data;
pub(crate) mod doctor;
pub(crate) mod eval;
pub(crate) mod export;
pub(crate) mod launch;
pub(crate) mod plan;
pub(crate) mod plot;
pub mod runlog;
pub(crate) mod steptime;
pub(crate) mod train;
pub(crate) mod verify;

use crate::model::Precision;
use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "cannon",
    version,
    about = "Mistral3 (Pixtral + Mistral) trainer: train (the main job), evaluate, export \
             checkpoints, prepare data, verify the model against a reference, time training \
             steps, compare and plot runs, check the machine",
    after_help = "Start with `cannon train`: with no arguments it trains a tiny Mistral3 on a \
                  synthetic shapes set on the CPU (a few minutes) and prints its held-out \
                  accuracy. On an Ascend NPU (a build with `--features npu`): `cannon train \
                  --set parallel.device=npu`, or `cannon launch --nproc 8 -- train --set \
                  parallel.device=npu` for one process per device."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train Mistral3 from a TOML config (default: the tiny built-in run on synthetic shapes).
    Train(train::TrainArgs),
    /// Held-out accuracy per question type of a saved model (a run's `final/` folder, a
    /// checkpoint, or an HF model folder).
    Eval(eval::EvalArgs),
    /// Report devices, CANN libraries and CPU features this build can use.
    Doctor,
    /// Make, inspect and check datasets (tokenize, synthesize, validate).
    Data(data::DataArgs),
    /// Compare the model's forward, gradients and AdamW steps with an eager reference fixture.
    Verify(verify::VerifyArgs),
    /// Time full training steps beside PyTorch's baseline script (`bench step`), or each
    /// memory and parallel feature against the run without it (`bench features`).
    Bench(bench::BenchArgs),
    /// Compare two runs' metrics JSONL: normalised loss difference and step time over a window
    /// (exit 0 within --threshold, 1 above, 2 unusable input), each run's step-time table
    /// (mean, median, p95, samples/s, wall time, peak memory), and with --plot a chart of both
    /// losses and their difference.
    Compare(compare::CompareArgs),
    /// Draw runs' metrics (loss, eval_loss, lr, step_ms, ...) to an SVG or PNG: one line per
    /// run, one panel per metric: `cannon plot runs/a runs/b --metric loss,lr -o runs.svg`;
    /// or a step profiler's trace as a timeline: `cannon plot --trace trace.json -o t.svg`.
    Plot(plot::PlotArgs),
    /// Write a checkpoint's model as a Hugging Face checkpoint (config.json + safetensors).
    Export(export::ExportArgs),
    /// Start one process per device with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
    /// MASTER_ADDR, MASTER_PORT): `cannon launch --nproc 8 -- train ...`.
    Launch(launch::LaunchArgs),
    /// Device memory of a training step per rank before anything runs (parameters,
    /// gradients, optimizer state, saved activations, logits, communication buffers) and
    /// whether it fits: `cannon plan --config DIR --set parallel.nproc=8 --device-memory 64`.
    Plan(plan::PlanArgs),
}

/// Parse the command line and run it; the exit code follows the subcommand's convention
/// (0 success, 1 a failed check, 2 unusable input).
pub fn main() -> ExitCode {
    crate::train::sharded::mark_start();
    let cli = Cli::parse();
    // The command runs on a worker of the kernels' thread pool, not beside it: every parallel
    // op is then a local push that the other workers steal, instead of an injection from
    // outside that wakes the pool and parks this thread (thousands per step on small models),
    // and the pool's idle spinning no longer competes with a third, driving thread for cores.
    rayon::scope(|_| run(cli))
}

fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Train(args) => train::run(args),
        Command::Eval(args) => eval::run(args),
        Command::Doctor => doctor::run(),
        Command::Data(args) => data::run(args),
        Command::Verify(args) => verify::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Compare(args) => compare::run(args),
        Command::Plot(args) => plot::run(args),
        Command::Export(args) => export::run(args),
        Command::Launch(args) => launch::run(args),
        Command::Plan(args) => plan::run(args),
    }
}

/// The `--dtype` of `verify`, `bench step` and `export`: a [`Precision`] by its name, the
/// names listed in `--help`.
fn precision_arg() -> impl clap::builder::TypedValueParser<Value = Precision> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(Precision::NAMES).try_map(|s| s.parse::<Precision>())
}
