//! `cannon eval --checkpoint DIR`: the held-out evaluation of `cannon train` on a saved model.
//!
//! `DIR` is a model folder as `cannon train` writes at the end of a run (`<run>/final`:
//! `config.json`, `model.safetensors` and `cannon_train.toml`, the run's config, which says
//! which tokenizer, vocabulary, image size and held-out set the model was trained with), a
//! training checkpoint (`<run>/checkpoints/step-<N>`, which holds the same `config.json` and
//! `cannon_train.toml`; or `<run>/checkpoints` for its newest), or any HF Mistral3 directory,
//! whose data settings then come from `--set` and the defaults.
//! Exit codes: 0 evaluated, 2 unusable input.

use crate::checkpoint::manifest::MANIFEST_FILE;
use crate::checkpoint::{resolve, Checkpoint, CheckpointDir, Snapshot};
use crate::config::TrainConfig;
use crate::data::dataset::{DataSet, SampleSettings};
use crate::data::info::DatasetSpec;
use crate::data::Tekken;
use crate::eval::evaluate;
use crate::model::{Exec, Mistral3};
use crate::train::run_plan::{image_config, RunPlan, FINAL_RUN_CONFIG};
use crate::train::TrainError;
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args, Debug, Clone)]
pub struct EvalArgs {
    /// A run's `final/` folder, a training checkpoint (`step-N/`, or a run's checkpoint
    /// folder for its newest), or an HF model folder.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Held-out JSONL set (default: the run's `data.eval_dataset`).
    #[arg(long)]
    pub dataset: Option<PathBuf>,
    /// Override a key of the run config (`--set data.tokenizer=...`).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub sets: Vec<String>,
    /// Write the report as JSON to this file too.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

pub fn run(args: EvalArgs) -> ExitCode {
    match eval(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cannon eval: {e}");
            ExitCode::from(2)
        }
    }
}

/// A training checkpoint (`step-<N>/`, or a run's checkpoint folder for its newest one), as
/// opposed to an HF model folder.
fn training_checkpoint(path: &Path) -> Option<PathBuf> {
    let is_ckpt = path.join(MANIFEST_FILE).is_file()
        || CheckpointDir::new(path)
            .latest()
            .is_ok_and(|latest| latest.is_some());
    is_ckpt.then(|| resolve(path).ok()).flatten()
}

fn eval(args: &EvalArgs) -> Result<(), TrainError> {
    let ckpt = training_checkpoint(&args.checkpoint);
    let dir = ckpt.clone().unwrap_or_else(|| args.checkpoint.clone());
    let saved = dir.join(FINAL_RUN_CONFIG);
    let file = saved.is_file().then_some(saved.as_path());
    let mut sets = args.sets.clone();
    // The model comes from the checkpoint, not from the run config's preset or directory.
    sets.push(format!("model.config={:?}", dir.display().to_string()));
    let cfg = TrainConfig::load(file, &sets)?;
    let plan = RunPlan::resolve(cfg, file)?;
    let dataset = args
        .dataset
        .clone()
        .or_else(|| plan.eval_dataset.clone())
        .ok_or_else(|| {
            TrainError::Input(
                "no held-out set: pass --dataset FILE (the checkpoint has no run config naming \
                 one)"
                    .into(),
            )
        })?;
    let tok = Tekken::from_file(&plan.tokenizer, plan.cfg.data.vocab_size)?;
    let model = match &ckpt {
        Some(path) => {
            let mut c = Checkpoint::open(path)?;
            eprintln!(
                "cannon eval: checkpoint {} (step {})",
                path.display(),
                c.step()
            );
            Snapshot::load(&mut c, Exec::cpu())?.model
        }
        None => Mistral3::load(&dir)?,
    };
    let image = image_config(&model.cfg, plan.cfg.data.longest_edge);
    let settings = SampleSettings {
        max_len: plan.cfg.data.max_len,
        system_prompt: plan.cfg.data.system_prompt.as_deref(),
        image: &image,
    };
    let spec = DatasetSpec::resolve(&dataset, plan.cfg.data.dataset_dir.as_deref())?;
    let (data, _) = DataSet::open_cached(&spec, &tok, &settings, &plan.cache_dir)?;
    let rep = match plan.cfg.train.dtype {
        crate::config::Dtype::F32 => {
            evaluate::<f32>(&model, &data, &tok, &image, plan.cfg.train.eval_batch)?
        }
        crate::config::Dtype::Bf16 => {
            evaluate::<half::bf16>(&model, &data, &tok, &image, plan.cfg.train.eval_batch)?
        }
    };
    println!(
        "{}: greedy answers on {} ({} samples)",
        args.checkpoint.display(),
        dataset.display(),
        rep.samples
    );
    print!("{}", rep.table());
    if let Some(p) = &args.json {
        let text = serde_json::to_string_pretty(&rep).unwrap_or_default();
        std::fs::write(p, text + "\n").map_err(|source| TrainError::Io {
            path: p.clone(),
            source,
        })?;
    }
    Ok(())
}
