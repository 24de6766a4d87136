//! A one-rank run's state and its save/restore: the model's f32 master weights, AdamW's
//! moments and step, and the progress that is not a tensor (step, scheduler, RNG, data
//! position and counts). Restoring it and running on gives the same losses and weights, bit
//! for bit, as never having stopped (the `checkpoint_resume` test checks it).
//!
//! [`save_one_rank`] / [`restore_one_rank`] work on the pieces a training loop holds;
//! [`Snapshot`] bundles them for code that builds the whole state from a checkpoint (eval,
//! tools, tests).

use super::error::{CheckpointError, Result};
use super::load::Checkpoint;
use super::manifest::{group_entries, padded_shards, DataState, OptimizerState};
use super::save::{save_local, RankShards, SaveMeta};
use super::CheckpointDir;
use crate::model::optim::AdamW;
use crate::model::{DeviceCtx, LossMode, Mistral3, ParamLayout, Params};
use crate::parallel::fsdp::Kind;
use serde_json::Value;
use std::path::PathBuf;

/// A run's progress besides its tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    /// Optimizer steps completed.
    pub step: u64,
    /// The run's effective configuration (saved in the manifest, for the record).
    pub config: Value,
    /// The LR scheduler's state, in the trainer's form.
    pub scheduler: Value,
    pub data: DataState,
    /// The run's random generator (`SplitMix64::state`).
    pub rng: u64,
}

/// The metadata of a one-rank save: every group whole on rank 0.
pub fn one_rank_meta(
    model: &Mistral3,
    model_config: &Value,
    opt: &AdamW,
    progress: &Progress,
) -> Result<SaveMeta> {
    let layout = &model.params.layout;
    let shards: Vec<_> = layout
        .groups
        .iter()
        .map(|g| padded_shards(g.len, 1))
        .collect();
    let trained: Vec<bool> = opt.m.iter().map(Option::is_some).collect();
    Ok(SaveMeta {
        step: progress.step,
        world_size: 1,
        config: progress.config.clone(),
        model_config: model_config.clone(),
        groups: group_entries(layout, &shards, &trained)?,
        optimizer: OptimizerState::adamw(&opt.cfg, opt.step),
        scheduler: progress.scheduler.clone(),
        data: progress.data,
        extra_files: Vec::new(),
        max_abs_weight: f64::INFINITY,
    })
}

/// Saves a one-rank run as `dir/step-<progress.step>/` and prunes to `keep_last` (0 keeps
/// all). `model_config` is the model's HF `config.json` (the file the run read, or
/// [`super::hf_config_json`] of a preset).
pub fn save_one_rank(
    dir: &CheckpointDir,
    keep_last: usize,
    model: &Mistral3,
    model_config: &Value,
    opt: &AdamW,
    progress: &Progress,
) -> Result<PathBuf> {
    let meta = one_rank_meta(model, model_config, opt, progress)?;
    let shards = RankShards::stored(0, &model.params.data, &opt.m, &opt.v, progress.rng)?;
    save_local(dir, &meta, &[shards], model.exec.stream(), keep_last)
}

/// Overwrites `model`'s weights and `opt`'s moments, step and hyper-parameters with
/// `ckpt`'s (consolidated if it was saved over several ranks) and returns the saved
/// progress (RNG: rank 0's). The model's layout and the set of trained groups must be the
/// checkpoint's: a changed freeze list is an error naming the group.
pub fn restore_one_rank(
    ckpt: &mut Checkpoint,
    model: &mut Mistral3,
    opt: &mut AdamW,
) -> Result<Progress> {
    let layout = model.params.layout.clone();
    ckpt.manifest().check_layout(&layout)?;
    let trained = ckpt_groups_trained(ckpt);
    for (g, &was) in trained.iter().enumerate() {
        let now = opt.m.get(g).is_some_and(Option::is_some);
        if was != now {
            let name = &ckpt.manifest().groups[g].name;
            return Err(CheckpointError::Mismatch(format!(
                "group {name} {} in the checkpoint but {} now (the freeze list changed?)",
                if was { "trained" } else { "was frozen" },
                if now { "trains" } else { "is frozen" },
            )));
        }
    }
    let exec = model.exec.clone();
    let stream = exec.stream();
    for g in 0..layout.groups.len() {
        let w = ckpt.read_group(Kind::Param, g)?;
        // Written where the run keeps them: the device, or the host pool (optimizer offload).
        model.params.data[g].write(stream, &w)?;
        if let (Some(m), Some(v)) = (opt.m[g].as_mut(), opt.v[g].as_mut()) {
            m.write(stream, &ckpt.read_group(Kind::ExpAvg, g)?)?;
            v.write(stream, &ckpt.read_group(Kind::ExpAvgSq, g)?)?;
        }
    }
    let man = ckpt.manifest();
    opt.cfg = man.optimizer.config();
    opt.step = man.optimizer.step;
    Ok(Progress {
        step: man.step,
        config: man.config.clone(),
        scheduler: man.scheduler.clone(),
        data: man.data,
        rng: man.rng[0],
    })
}

/// A one-rank run's whole state.
#[derive(Debug)]
pub struct Snapshot {
    pub model: Mistral3,
    /// The model's HF `config.json`.
    pub model_config: Value,
    pub opt: AdamW,
    pub progress: Progress,
}

impl Snapshot {
    /// The save's metadata (see [`one_rank_meta`]).
    pub fn save_meta(&self) -> Result<SaveMeta> {
        one_rank_meta(&self.model, &self.model_config, &self.opt, &self.progress)
    }

    /// [`save_one_rank`].
    pub fn save(&self, dir: &CheckpointDir, keep_last: usize) -> Result<PathBuf> {
        save_one_rank(
            dir,
            keep_last,
            &self.model,
            &self.model_config,
            &self.opt,
            &self.progress,
        )
    }

    /// The state saved in `ckpt`, on `exec`'s device: the model from the checkpoint's config
    /// and weights, the moments of the groups that trained.
    pub fn load(ckpt: &mut Checkpoint, exec: DeviceCtx) -> Result<Self> {
        let cfg = ckpt.model_config()?;
        let model_config = ckpt.model_config_json()?;
        let layout = ParamLayout::new(&cfg);
        ckpt.manifest().check_layout(&layout)?;
        // Zeroed moments for the groups that trained; the restore fills them.
        let trained = ckpt_groups_trained(ckpt);
        let (mut m, mut v) = (Vec::new(), Vec::new());
        for (gl, &t) in layout.groups.iter().zip(&trained) {
            m.push(t.then(|| exec.zeros::<f32>(&[gl.len])).transpose()?);
            v.push(t.then(|| exec.zeros::<f32>(&[gl.len])).transpose()?);
        }
        let mut opt = AdamW::from_moments(ckpt.manifest().optimizer.config(), 0, m, v);
        let params = Params::zeros(&exec, layout)?;
        let mut model = Mistral3 {
            cfg,
            params,
            loss_mode: LossMode::Full,
            memory: Default::default(),
            exec,
        };
        let progress = restore_one_rank(ckpt, &mut model, &mut opt)?;
        Ok(Snapshot {
            model,
            model_config,
            opt,
            progress,
        })
    }

    /// Overwrites this state with `ckpt`'s (see [`restore_one_rank`]).
    pub fn restore(&mut self, ckpt: &mut Checkpoint) -> Result<()> {
        self.progress = restore_one_rank(ckpt, &mut self.model, &mut self.opt)?;
        Ok(())
    }
}

fn ckpt_groups_trained(ckpt: &Checkpoint) -> Vec<bool> {
    ckpt.manifest().groups.iter().map(|g| g.trained).collect()
}
