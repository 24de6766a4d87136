//! `cannon bench step`: times full training steps of an HF config (see [`crate::app::bench`]) and
//! prints one JSON line with the fields of `shared/bench/torch_train_step.py`, so the two can
//! be run side by side. `cannon bench features`: the feature table of
//! [`crate::app::bench::features`]. Exit codes: 0 measured, 2 unusable input.

use crate::app::bench::{self, StepBench};
use crate::model::Mistral3Config;
use crate::model::Precision;
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchWhat,
}

#[derive(Subcommand, Debug, Clone)]
pub enum BenchWhat {
    /// Full training steps (forward, backward, clip, AdamW) with random weights, vision tower
    /// and projector frozen, on B rows of S tokens holding one PX x PX image each.
    Step(StepArgs),
    /// Each memory and parallel feature against the same run with it off (20 steps of the
    /// `cannon train` config, statistics from step 6): loss difference, allocator peaks, step
    /// time, and the baseline's repeat-run noise.
    Features(FeaturesArgs),
}

#[derive(Args, Debug, Clone)]
pub struct FeaturesArgs {
    /// The `cannon train` config (absent: the built-in default).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override one key of every run: `--set train.micro_batch=16`.
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub sets: Vec<String>,
    /// Write the rows as JSON here.
    #[arg(long)]
    pub json: PathBuf,
    /// Only these rows (repeatable): ulysses, ring, hybrid, recompute, chunk_loss,
    /// offload_activations, offload_optimizer.
    #[arg(long)]
    pub only: Vec<String>,
}

#[derive(Args, Debug, Clone)]
pub struct StepArgs {
    /// HF model directory (its config.json is read; weights are random).
    #[arg(long)]
    pub config: PathBuf,
    #[arg(long, default_value_t = 2)]
    pub batch: usize,
    #[arg(long, default_value_t = 1024)]
    pub seq: usize,
    /// Image side in pixels (a multiple of patch_size x spatial_merge_size).
    #[arg(long, default_value_t = 224)]
    pub img: usize,
    #[arg(long, default_value_t = 6)]
    pub steps: usize,
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    #[arg(long, value_parser = super::precision_arg(), default_value = "f32")]
    pub dtype: Precision,
    /// In-process CPU ranks of a sharded (FSDP) run; the batch's rows are split evenly.
    #[arg(long, default_value_t = 1)]
    pub nproc: usize,
    /// Also append the JSON line to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Seed of the random weights and batch.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

pub fn run(args: BenchArgs) -> ExitCode {
    match args.what {
        BenchWhat::Step(a) => match step(&a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("cannon bench step: {e}");
                ExitCode::from(2)
            }
        },
        BenchWhat::Features(a) => match features(&a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("cannon bench features: {e}");
                ExitCode::from(2)
            }
        },
    }
}

fn features(a: &FeaturesArgs) -> Result<(), String> {
    use crate::app::bench::features as f;
    let names: Vec<&str> = f::features().iter().map(|r| r.name).collect();
    if let Some(bad) = a.only.iter().find(|n| !names.contains(&n.as_str())) {
        return Err(format!(
            "--only {bad}: no such row (rows: {})",
            names.join(", ")
        ));
    }
    let only = (!a.only.is_empty()).then_some(a.only.as_slice());
    let work = f::work_dir();
    let rows = f::run(a.config.as_deref(), &a.sets, &work, only);
    let _ = std::fs::remove_dir_all(&work);
    let rows = rows.map_err(|e| e.to_string())?;
    println!(
        "# {} steps per run, statistics over steps {}..={}; changes are feature on vs off",
        f::STEPS,
        f::FIRST,
        f::STEPS
    );
    print!("{}", f::table(&rows));
    let json = serde_json::to_string_pretty(&f::to_json(&rows)).unwrap_or_default();
    std::fs::write(&a.json, json + "\n").map_err(|e| format!("{}: {e}", a.json.display()))?;
    println!("rows written to {}", a.json.display());
    Ok(())
}

fn step(a: &StepArgs) -> Result<(), String> {
    let cfg = Mistral3Config::from_file(&a.config.join("config.json"))
        .map_err(|e| format!("{}: {e}", a.config.display()))?;
    let b = StepBench {
        batch: a.batch,
        seq: a.seq,
        img: a.img,
        steps: a.steps,
        warmup: a.warmup,
        precision: a.dtype,
        seed: a.seed,
    };
    let report = if a.nproc == 1 {
        bench::run(&cfg, &b).map_err(|e| e.to_string())?
    } else {
        bench::sharded::run_sharded(&cfg, &b, a.nproc).map_err(|e| e.to_string())?
    };
    let line = report.to_json();
    println!("{line}");
    if let Some(path) = &a.json {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        writeln!(f, "{line}").map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
