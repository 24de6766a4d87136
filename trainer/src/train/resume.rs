//! Checkpoints of `cannon train`: the [`StepHook`] that saves `[checkpoint] every` steps
//! (and at the last step), keeping `keep_last`, and the resume that puts a saved state back
//! into a [`Trainer`] (`[checkpoint] resume = true | "DIR"`).
//!
//! A checkpoint holds the [`TrainState`]: weights (f32 masters), AdamW moments and step, the
//! step, the data position and the consumed/dropped counts. The LR schedule is a function of
//! the config and the step, and the loop draws no random numbers after the model's init, so
//! this is all a run needs to continue bit for bit (the `train_resume` test checks it). The
//! saved scheduler settings and run config are recorded for the reader; the run's TOML config
//! is saved beside the manifest as `cannon_train.toml`, so `cannon eval --checkpoint` reads a
//! checkpoint like a run's `final/` folder.

use super::run::{RunPlan, StepHook, TrainError, TrainState, Trainer, FINAL_RUN_CONFIG};
use crate::checkpoint::state::one_rank_meta;
use crate::checkpoint::{
    restore_one_rank, save_local, Checkpoint, CheckpointDir, CheckpointError, DataState, Progress,
    RankShards,
};
use crate::config::Resume;
use std::path::PathBuf;

/// The checkpoint progress record of a training state.
pub fn progress(plan: &RunPlan, state: &TrainState) -> Progress {
    Progress {
        step: state.step as u64,
        config: serde_json::to_value(plan.effective()).unwrap_or_default(),
        scheduler: serde_json::json!({
            "schedule": state.schedule,
            "step": state.step,
            "next_lr": state.schedule.at(state.step),
        }),
        data: DataState {
            position: state.position,
            consumed_samples: state.samples,
            consumed_tokens: state.tokens,
            dropped_samples: state.dropped_samples,
        },
        // The loop draws no random numbers (the data order is a function of the seed and
        // the position): the generator recorded is the seed's.
        rng: plan.cfg.train.seed,
    }
}

/// Saves `state` as `plan`'s checkpoint of its current step, keeping `keep_last`.
pub fn save(
    plan: &RunPlan,
    state: &TrainState,
    model_json: &serde_json::Value,
) -> Result<PathBuf, CheckpointError> {
    let p = progress(plan, state);
    let mut meta = one_rank_meta(&state.model, model_json, &state.opt, &p)?;
    meta.extra_files
        .push((FINAL_RUN_CONFIG.to_string(), plan.effective().to_toml()));
    let shards = RankShards::device(
        0,
        &state.model.params.data,
        &state.opt.m,
        &state.opt.v,
        p.rng,
    )?;
    let dir = CheckpointDir::new(&plan.checkpoint_dir);
    save_local(
        &dir,
        &meta,
        &[shards],
        state.model.exec.stream(),
        plan.cfg.checkpoint.keep_last,
    )
}

/// Saves a checkpoint every `[checkpoint] every` steps and after the last step.
#[derive(Debug)]
pub struct CheckpointHook {
    every: usize,
    model_json: serde_json::Value,
    /// The checkpoints written, in order.
    pub saved: Vec<PathBuf>,
}

impl CheckpointHook {
    /// The hook of `trainer`'s run (None when `[checkpoint] every` is 0).
    pub fn new(trainer: &Trainer) -> Option<Self> {
        let every = trainer.plan.cfg.checkpoint.every;
        (every > 0).then(|| CheckpointHook {
            every,
            model_json: trainer.model_json.clone(),
            saved: Vec::new(),
        })
    }
}

impl StepHook for CheckpointHook {
    fn after_step(&mut self, plan: &RunPlan, state: &TrainState) -> Result<(), TrainError> {
        if state.step.is_multiple_of(self.every) || state.step == state.total_steps {
            self.saved.push(save(plan, state, &self.model_json)?);
        }
        Ok(())
    }
}

/// The checkpoint `[checkpoint] resume` names: None for `false`, the newest complete one in
/// the checkpoint folder for `true` (None if there is none yet: a fresh start), the given
/// directory (or its newest) for a path.
pub fn resume_from(plan: &RunPlan) -> Result<Option<Checkpoint>, CheckpointError> {
    match &plan.cfg.checkpoint.resume {
        Resume::Latest(false) => Ok(None),
        Resume::Latest(true) => {
            let dir = CheckpointDir::new(&plan.checkpoint_dir);
            match dir.latest()? {
                Some((_, path)) => Checkpoint::open(&path).map(Some),
                None => Ok(None),
            }
        }
        Resume::Path(p) => Checkpoint::open(p).map(Some),
    }
}

/// What [`resume`] restored.
#[derive(Clone, Debug, PartialEq)]
pub struct Resumed {
    pub step: usize,
    pub dir: PathBuf,
    /// The world size it was saved with (a different one is resharded: here, consolidated).
    pub world_size: usize,
    /// The saved schedule when it differs from this run's (the config changed).
    pub schedule_changed: Option<serde_json::Value>,
}

/// Overwrites `trainer`'s state with `ckpt`'s and moves the loader to its position.
pub fn resume(trainer: &mut Trainer, ckpt: &mut Checkpoint) -> Result<Resumed, TrainError> {
    let s = &mut trainer.state;
    let p = restore_one_rank(ckpt, &mut s.model, &mut s.opt)?;
    s.step = p.step as usize;
    s.position = p.data.position;
    s.samples = p.data.consumed_samples;
    s.tokens = p.data.consumed_tokens;
    s.dropped_samples = p.data.dropped_samples;
    if s.step > s.total_steps {
        return Err(TrainError::Input(format!(
            "the checkpoint {} is at step {}, past this run's {} steps (raise train.steps)",
            ckpt.dir().display(),
            s.step,
            s.total_steps
        )));
    }
    let saved = p.scheduler.get("schedule").cloned();
    let now = serde_json::to_value(s.schedule).ok();
    let schedule_changed = (saved.is_some() && saved != now).then(|| saved.unwrap_or_default());
    let step = s.step;
    trainer.restore_position();
    Ok(Resumed {
        step,
        dir: ckpt.dir().to_path_buf(),
        world_size: ckpt.manifest().world_size,
        schedule_changed,
    })
}
