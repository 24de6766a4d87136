//! `cannon eval --checkpoint DIR`: the held-out evaluation of `cannon train` on a saved model.
//!
//! `DIR` is a model folder as `cannon train` writes at the end of a run (`<run>/final`:
//! `config.json`, `model.safetensors` and `cannon_train.toml`, the run's config, which says
//! which tokenizer, vocabulary, image size and held-out set the model was trained with), or
//! any HF Mistral3 directory, whose data settings then come from `--set` and the defaults.
//! Exit codes: 0 evaluated, 2 unusable input.

use crate::config::TrainConfig;
use crate::data::dataset::{DataSet, SampleSettings};
use crate::data::info::DatasetSpec;
use crate::data::Tekken;
use crate::eval::evaluate;
use crate::model::Mistral3;
use crate::train::run::{image_config, RunPlan, FINAL_RUN_CONFIG};
use crate::train::TrainError;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug, Clone)]
pub struct EvalArgs {
    /// Model folder: `config.json` + safetensors (a run's `final/` folder, or an HF model).
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

fn eval(args: &EvalArgs) -> Result<(), TrainError> {
    let saved = args.checkpoint.join(FINAL_RUN_CONFIG);
    let file = saved.is_file().then_some(saved.as_path());
    let mut sets = args.sets.clone();
    // The model comes from the checkpoint, not from the run config's preset or directory.
    sets.push(format!(
        "model.config={:?}",
        args.checkpoint.display().to_string()
    ));
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
    let model = Mistral3::load(&args.checkpoint)?;
    let image = image_config(&model.cfg, plan.cfg.data.longest_edge);
    let settings = SampleSettings {
        max_len: plan.cfg.data.max_len,
        system_prompt: plan.cfg.data.system_prompt.as_deref(),
        image: &image,
    };
    let spec = DatasetSpec::resolve(&dataset, plan.cfg.data.dataset_dir.as_deref())?;
    let data = DataSet::open(&spec, &tok, &settings)?;
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
