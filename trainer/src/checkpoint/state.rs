//! The state of a one-rank run and its save/restore: the model's f32 master weights, AdamW's
//! moments and step, and the progress that is not a tensor (step, scheduler, RNG, data
//! position). Restoring it and running on gives the same losses and weights, bit for bit, as
//! never having stopped (the `resume` test checks it).

use super::error::{CheckpointError, Result};
use super::load::{Checkpoint, Kind};
use super::manifest::{group_entries, padded_shards, DataState, OptimizerState};
use super::save::{save_local, RankShards, SaveMeta};
use super::CheckpointDir;
use crate::model::optim::AdamW;
use crate::model::{Exec, LossMode, Mistral3, ParamLayout, Params};
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

/// Everything a one-rank run needs to continue.
#[derive(Debug)]
pub struct TrainState {
    pub model: Mistral3,
    /// The model's HF `config.json` (the file the run read, or [`super::hf_config_json`]).
    pub model_config: Value,
    pub opt: AdamW,
    pub progress: Progress,
}

impl TrainState {
    /// The save's metadata: one rank holding every group whole.
    pub fn save_meta(&self) -> Result<SaveMeta> {
        let layout = &self.model.params.layout;
        let shards: Vec<_> = layout
            .groups
            .iter()
            .map(|g| padded_shards(g.len, 1))
            .collect();
        let trained: Vec<bool> = self.opt.m.iter().map(Option::is_some).collect();
        Ok(SaveMeta {
            step: self.progress.step,
            world_size: 1,
            config: self.progress.config.clone(),
            model_config: self.model_config.clone(),
            groups: group_entries(layout, &shards, &trained)?,
            optimizer: OptimizerState::adamw(&self.opt.cfg, self.opt.step),
            scheduler: self.progress.scheduler.clone(),
            data: self.progress.data,
        })
    }

    /// Saves as `dir/step-<progress.step>/` and prunes to `keep_last` (0 keeps all).
    pub fn save(&self, dir: &CheckpointDir, keep_last: usize) -> Result<PathBuf> {
        let meta = self.save_meta()?;
        let shards = RankShards {
            rank: 0,
            params: &self.model.params.data,
            exp_avg: &self.opt.m,
            exp_avg_sq: &self.opt.v,
            rng: self.progress.rng,
        };
        save_local(dir, &meta, &[shards], self.model.exec.stream(), keep_last)
    }

    /// The state saved in `ckpt`, on `exec`'s device: the model from the checkpoint's config
    /// and weights (consolidated if it was saved over several ranks), the moments of the
    /// groups that trained. RNG: rank 0's.
    pub fn load(ckpt: &mut Checkpoint, exec: Exec) -> Result<Self> {
        let cfg = ckpt.model_config()?;
        let model_config = ckpt.model_config_json()?;
        let layout = ParamLayout::new(&cfg);
        ckpt.manifest().check_layout(&layout)?;
        // Zeroed moments for the groups that trained; `restore` fills them.
        let trained = ckpt_groups_trained(ckpt);
        let (mut m, mut v) = (Vec::new(), Vec::new());
        for (gl, &t) in layout.groups.iter().zip(&trained) {
            m.push(t.then(|| exec.zeros::<f32>(&[gl.len])).transpose()?);
            v.push(t.then(|| exec.zeros::<f32>(&[gl.len])).transpose()?);
        }
        let opt = AdamW {
            cfg: ckpt.manifest().optimizer.config(),
            step: 0,
            m,
            v,
        };
        let params = Params::zeros(&exec, layout)?;
        let mut state = TrainState {
            model: Mistral3 {
                cfg,
                params,
                loss_mode: LossMode::Full,
                exec,
            },
            model_config,
            opt,
            progress: Progress {
                step: 0,
                config: Value::Null,
                scheduler: Value::Null,
                data: DataState::default(),
                rng: 0,
            },
        };
        state.restore(ckpt)?;
        Ok(state)
    }

    /// Overwrites this state with `ckpt`'s: weights, moments, AdamW step and
    /// hyper-parameters, progress. The model's layout and the set of trained groups must be
    /// the checkpoint's (a changed freeze list is an error naming the group).
    pub fn restore(&mut self, ckpt: &mut Checkpoint) -> Result<()> {
        let layout = self.model.params.layout.clone();
        ckpt.manifest().check_layout(&layout)?;
        let trained = ckpt_groups_trained(ckpt);
        for (g, &was) in trained.iter().enumerate() {
            let now = self.opt.m.get(g).is_some_and(Option::is_some);
            if was != now {
                let name = &ckpt.manifest().groups[g].name;
                return Err(CheckpointError::Mismatch(format!(
                    "group {name} {} in the checkpoint but {} now (the freeze list changed?)",
                    if was { "trained" } else { "was frozen" },
                    if now { "trains" } else { "is frozen" },
                )));
            }
        }
        let exec = self.model.exec.clone();
        let stream = exec.stream();
        for g in 0..layout.groups.len() {
            let w = ckpt.read_group(Kind::Param, g)?;
            self.model.params.data[g]
                .view_mut()
                .memcpy_htod(stream, &w)?;
            if let (Some(m), Some(v)) = (self.opt.m[g].as_mut(), self.opt.v[g].as_mut()) {
                m.view_mut()
                    .memcpy_htod(stream, &ckpt.read_group(Kind::ExpAvg, g)?)?;
                v.view_mut()
                    .memcpy_htod(stream, &ckpt.read_group(Kind::ExpAvgSq, g)?)?;
            }
        }
        let man = ckpt.manifest();
        self.opt.cfg = man.optimizer.config();
        self.opt.step = man.optimizer.step;
        self.progress = Progress {
            step: man.step,
            config: man.config.clone(),
            scheduler: man.scheduler.clone(),
            data: man.data,
            rng: man.rng[0],
        };
        Ok(())
    }
}

fn ckpt_groups_trained(ckpt: &Checkpoint) -> Vec<bool> {
    ckpt.manifest().groups.iter().map(|g| g.trained).collect()
}
