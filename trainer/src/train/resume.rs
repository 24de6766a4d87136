//! Checkpoints of `cannon train`: every rank's part of a step's checkpoint
//! ([`save_sharded`], called by every rank after the steps `[checkpoint] every` names and
//! after the last, keeping `keep_last`), and the resume (`[checkpoint] resume = true |
//! "DIR"`): [`resume_setup`] takes the checkpoint's counters, and each rank reads its own
//! slices of the weights and moments, whatever world size saved them.
//!
//! A checkpoint holds the weights (f32 masters), AdamW moments and step, the step, the data
//! position and the consumed/dropped counts. The LR schedule is a function of the config and
//! the step, and the loop draws no random numbers after the model's init, so this is all a
//! run needs to continue bit for bit (the `train_resume` test checks it). The saved
//! scheduler settings and run config are recorded for the reader; the run's TOML config is
//! saved beside the manifest as `cannon_train.toml`, so `cannon eval --checkpoint` reads a
//! checkpoint like a run's `final/` folder.

use super::error::TrainError;
use super::resolve::{ResolvedRun, FINAL_RUN_CONFIG};
use super::schedule::LrSchedule;
use super::setup::{Counters, RunSetup};
use crate::parallel::fsdp::FsdpRank;
use crate::train::checkpoint::manifest::{group_entries, OptimizerState};
use crate::train::checkpoint::{
    padded_shards, save_distributed, Checkpoint, CheckpointDir, CheckpointError, DataState,
    Progress, RankShards, SaveMeta,
};
use crate::train::config::Resume;
use std::path::PathBuf;

/// The checkpoint progress record of a run at `c`.
pub fn progress_at(plan: &ResolvedRun, c: &Counters) -> Progress {
    Progress {
        step: c.step as u64,
        config: serde_json::to_value(plan.effective()).unwrap_or_default(),
        scheduler: serde_json::json!({
            "schedule": c.schedule,
            "step": c.step,
            "skipped_steps": c.skipped,
            "next_lr": c.schedule.at(applied(c.step, c.skipped)),
        }),
        data: DataState {
            position: c.position,
            consumed_samples: c.samples,
            consumed_tokens: c.tokens,
            dropped_samples: c.dropped_samples,
        },
        // The loop draws no random numbers (the data order is a function of the seed and
        // the position): the generator recorded is the seed's.
        rng: plan.cfg.train.seed,
    }
}

/// The steps applied of `step` taken with `skipped` skipped: what the learning rate follows
/// (a skipped step leaves the schedule where it was, as it leaves the weights).
pub fn applied(step: usize, skipped: u64) -> usize {
    step.saturating_sub(skipped as usize)
}

/// Whether a checkpoint is due after step `step` (1-based) of `total`.
pub fn due(plan: &ResolvedRun, step: usize, total: usize) -> bool {
    let every = plan.cfg.checkpoint.every;
    every > 0 && (step.is_multiple_of(every) || step == total)
}

/// Saves one FSDP rank's shards as its part of `plan`'s checkpoint at `c` (collective: every
/// rank calls it after the same step).
pub fn save_sharded(
    plan: &ResolvedRun,
    model_json: &serde_json::Value,
    rank: &FsdpRank,
    c: &Counters,
) -> Result<PathBuf, CheckpointError> {
    let mut extra = vec![(FINAL_RUN_CONFIG.to_string(), plan.effective().to_toml())];
    for (name, path) in plan.model_folder_files() {
        let text = std::fs::read_to_string(&path).map_err(|source| CheckpointError::Io {
            path: path.clone(),
            source,
        })?;
        extra.push((name.to_string(), text));
    }
    save_rank(
        &CheckpointDir::new(&plan.checkpoint_dir),
        plan.cfg.checkpoint.keep_last,
        model_json,
        rank,
        progress_at(plan, c),
        extra,
        plan.cfg.train.max_abs_weight,
    )
}

/// Saves `rank`'s shards as its part of the checkpoint of `p.step` in `dir`, keeping the
/// newest `keep_last` (collective: every rank calls it after the same step). The layout is
/// the ranks' own (`fsdp::ShardLayout`, the padded even cut of [`padded_shards`]); each
/// tensor goes from where the rank keeps it to the file one at a time, so the host holds
/// one tensor's copy, never the rank's state. A tensor with a non-finite value, or a weight of
/// magnitude past `max_abs_weight`, on any rank stops the save before anything is committed.
pub fn save_rank(
    dir: &CheckpointDir,
    keep_last: usize,
    model_json: &serde_json::Value,
    rank: &FsdpRank,
    p: Progress,
    extra_files: Vec<(String, String)>,
    max_abs_weight: f64,
) -> Result<PathBuf, CheckpointError> {
    let world = rank.world_size();
    let layout = rank.layout();
    let shards: Vec<_> = layout
        .groups
        .iter()
        .map(|g| padded_shards(g.len, world))
        .collect();
    let trained: Vec<bool> = (0..layout.groups.len()).map(|g| rank.trains(g)).collect();
    let meta = SaveMeta {
        step: p.step,
        world_size: world,
        config: p.config,
        model_config: model_json.clone(),
        groups: group_entries(layout, &shards, &trained)?,
        optimizer: OptimizerState::adamw(&rank.settings().adamw, rank.steps_taken()),
        scheduler: p.scheduler,
        data: p.data,
        extra_files,
        max_abs_weight,
    };
    let (params, m, v) = rank.shards();
    let mine = RankShards::stored(rank.rank(), params, m, v, p.rng)?;
    save_distributed(
        dir,
        &meta,
        &mine,
        rank.comm(),
        rank.exec().stream(),
        keep_last,
    )
}

/// The checkpoint `[checkpoint] resume` names: None for `false`, the newest complete one in
/// the checkpoint folder for `true` (None if there is none yet: a fresh start), the given
/// directory (or its newest) for a path.
pub fn resume_from(plan: &ResolvedRun) -> Result<Option<Checkpoint>, CheckpointError> {
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

/// What [`resume_setup`] restored.
#[derive(Clone, Debug, PartialEq)]
pub struct Resumed {
    pub step: usize,
    pub dir: PathBuf,
    /// The world size it was saved with (a different one is resharded: here, consolidated).
    pub world_size: usize,
    /// The saved schedule when it differs from this run's (the config changed).
    pub schedule_changed: Option<serde_json::Value>,
}

/// The saved schedule when it is not `now` (the config changed).
fn schedule_change(saved: &serde_json::Value, now: &LrSchedule) -> Option<serde_json::Value> {
    let saved = saved.get("schedule").cloned();
    let now = serde_json::to_value(now).ok();
    (saved.is_some() && saved != now).then(|| saved.unwrap_or_default())
}

/// Sets `setup`'s counters to `ckpt`'s and moves its loader there: a sharded run resumed
/// this way reads nothing of the weights here; each rank reads its own slices of the
/// checkpoint's weights and moments ([`RunSetup::source`]), whatever world size saved it.
/// The model's layout and trained groups must be the checkpoint's (checked here for the
/// layout, by every rank for the trained groups).
pub fn resume_setup(setup: &mut RunSetup, ckpt: &Checkpoint) -> Result<Resumed, TrainError> {
    let man = ckpt.manifest();
    man.check_layout(&crate::model::ParamLayout::new(&setup.cfg))?;
    let step = man.step as usize;
    if step > setup.total_steps {
        return Err(TrainError::Input(format!(
            "the checkpoint {} is at step {step}, past this run's {} steps (raise train.steps)",
            ckpt.dir().display(),
            setup.total_steps
        )));
    }
    let at = &mut setup.at;
    at.step = step;
    at.position = man.data.position;
    at.samples = man.data.consumed_samples;
    at.tokens = man.data.consumed_tokens;
    at.dropped_samples = man.data.dropped_samples;
    // Absent from checkpoints written before steps could be skipped: none were.
    at.skipped = man
        .scheduler
        .get("skipped_steps")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0);
    let schedule_changed = schedule_change(&man.scheduler, &at.schedule);
    setup.restore_position();
    setup.resume = Some(ckpt.dir().to_path_buf());
    Ok(Resumed {
        step,
        dir: ckpt.dir().to_path_buf(),
        world_size: man.world_size,
        schedule_changed,
    })
}
