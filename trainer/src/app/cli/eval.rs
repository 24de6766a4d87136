//! `cannon eval --checkpoint DIR`: the held-out evaluation of `cannon train` on a saved model.
//!
//! `DIR` is a model folder as `cannon train` writes at the end of a run (`<run>/final`:
//! `config.json`, `model.safetensors` and `cannon_train.toml`, the run's config, which says
//! which tokenizer, vocabulary, image size and held-out set the model was trained with), a
//! training checkpoint (`<run>/checkpoints/step-<N>`, which holds the same `config.json` and
//! `cannon_train.toml`; or `<run>/checkpoints` for its newest), or any HF Mistral3 directory,
//! whose data settings then come from `--set` and the defaults.
//!
//! The model is never built whole: like a run's ranks, `parallel.nproc` CPU ranks (one by
//! default), one NPU (`parallel.device = npu`) or the ranks of a `cannon launch` job each read
//! only their slices of the weights, and each scores its rows of every held-out batch on its
//! shards (`eval::sharded`).
//! Exit codes: 0 evaluated, 2 unusable input.

use crate::model::optim::AdamWConfig;
use crate::model::weights::HfWeights;
use crate::model::Precision;
use crate::model::{DeviceCtx, LossMode, ModelError, ParamLayout, Part};
use crate::parallel::fsdp::{run_cpu_ranks, FsdpError, FsdpRank, FsdpSettings, ShardSource};
use crate::train::checkpoint::manifest::MANIFEST_FILE;
use crate::train::checkpoint::{resolve, Checkpoint, CheckpointDir};
use crate::train::config::{DeviceKind, TrainConfig};
use crate::train::data::dataset::DataSet;
use crate::train::data::info::DatasetSpec;
use crate::train::eval::sharded::evaluate_on;
use crate::train::resolve::{ResolvedRun, FINAL_RUN_CONFIG};
use crate::train::samples::SampleSetup;
use crate::train::settings::memory_features;
use crate::train::TrainError;
use cannon_runtime::comm::Communicator;
use cannon_runtime::Device;
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args, Debug, Clone)]
pub struct EvalArgs {
    /// A run's `final/` folder, a training checkpoint (`step-N/`, or a run's checkpoint
    /// folder for its newest), or an HF model folder.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Held-out JSONL set (default: the run's `data.eval_dataset`, or the part of its
    /// training set `data.eval_split` held out).
    #[arg(long)]
    pub dataset: Option<PathBuf>,
    /// Override a key of the run config (`--set data.tokenizer=...`).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub sets: Vec<String>,
    /// Write the report as JSON to this file too.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// How long a rank waits for its peers at a collective.
const RANK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

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
    let plan = ResolvedRun::resolve(cfg, file)?;
    // The run's held-out set: its file, or the part of its training set it held out.
    let (dataset, split) =
        match (&args.dataset, &plan.eval_dataset) {
            (Some(d), _) | (None, Some(d)) => (d.clone(), None),
            (None, None) if plan.cfg.data.eval_split > 0.0 => {
                (plan.dataset.clone(), Some(plan.cfg.data.eval_split))
            }
            (None, None) => return Err(TrainError::Input(
                "no held-out set: pass --dataset FILE (the checkpoint has no run config naming \
                 one)"
                    .into(),
            )),
        };
    let samples_of = SampleSetup::new(&plan)?;
    let (tok, cfg) = (&samples_of.tok, &samples_of.mcfg);
    let layout = ParamLayout::new(cfg);
    // Every rank reads only its slices of the weights (as a run's ranks start).
    let weights;
    let source = match &ckpt {
        Some(path) => {
            let c = Checkpoint::open(path)?;
            eprintln!(
                "cannon eval: checkpoint {} (step {})",
                path.display(),
                c.step()
            );
            ShardSource::Checkpoint(path)
        }
        None => {
            weights = HfWeights::open(&dir, &layout).map_err(ModelError::from)?;
            ShardSource::Weights(&weights)
        }
    };
    let image = &samples_of.image;
    let samples = samples_of.settings(plan.cfg.data.max_len);
    let spec = DatasetSpec::resolve(&dataset, plan.cfg.data.dataset_dir.as_deref())?;
    let (mut data, _) = DataSet::open_cached(&spec, tok, &samples, &plan.cache_dir)?;
    if let Some(fraction) = split {
        data = data.split_off_holdout(fraction, plan.cfg.train.seed);
    }
    // Nothing trains: no gradient, no moment; the run's memory features apply.
    let (_, memory) = memory_features(&plan.cfg.train);
    let settings = FsdpSettings {
        adamw: AdamWConfig::default(),
        max_grad_norm: 0.0,
        frozen: vec![Part::Vision, Part::Projector, Part::Text],
        loss_mode: LossMode::Full,
        memory,
    };
    let rows = plan.cfg.train.eval_batch;
    let body = |comm: Communicator, exec: DeviceCtx| {
        let mut rank = FsdpRank::new(comm, exec, cfg.clone(), source, settings.clone())?;
        let rep = match plan.cfg.train.dtype {
            Precision::F32 => evaluate_on::<f32>(&mut rank, &data, tok, image, rows),
            Precision::Bf16 => evaluate_on::<half::bf16>(&mut rank, &data, tok, image, rows),
        };
        rep.map_err(|e| FsdpError::Invalid(e.to_string()))
    };
    let ranks_err = |e: FsdpError| TrainError::Input(e.to_string());
    let job = super::train::npu_job(&plan)?;
    let lead = job.as_ref().is_none_or(|c| c.rank() == 0);
    let nproc = plan.cfg.parallel.nproc;
    let reports = match (job, plan.cfg.parallel.device) {
        (Some(comm), _) => {
            let exec = DeviceCtx::new(comm.device()).map_err(ModelError::from)?;
            vec![body(comm, exec).map_err(ranks_err)?]
        }
        (None, DeviceKind::Npu) => {
            let device = Device::Npu(super::train::local_rank());
            let exec =
                DeviceCtx::new(device).map_err(|e| TrainError::Input(format!("{device}: {e}")))?;
            vec![body(Communicator::solo(device, RANK_TIMEOUT), exec).map_err(ranks_err)?]
        }
        (None, DeviceKind::Cpu) if nproc > 1 => {
            eprintln!("cannon eval: on {nproc} CPU ranks, each on its shards and its rows");
            run_cpu_ranks(nproc, RANK_TIMEOUT, body).map_err(ranks_err)?
        }
        (None, DeviceKind::Cpu) => {
            vec![body(
                Communicator::solo(Device::Cpu, RANK_TIMEOUT),
                DeviceCtx::cpu(),
            )
            .map_err(ranks_err)?]
        }
    };
    // Every rank holds the same report; the job's rank 0 prints it.
    let Some(rep) = reports.into_iter().next().filter(|_| lead) else {
        return Ok(());
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
