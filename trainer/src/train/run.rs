//! What a training run reports: the [`RunSummary`] of a finished run, and the [`StepHook`]
//! a caller runs after every step (how it fails is [`super::error::TrainError`]). The run itself is
//! [`super::setup::RunSetup`] (data, tokenizer, model config, where the weights come from)
//! trained by the one driver loop of [`super::sharded`], on one process alone (a world of
//! one) or on N ranks.
//!
//! Everything a checkpoint must hold to continue the run bit for bit: the step, the schedule
//! (a pure function of the step), the loader's position (the data order is a function of the
//! seed and the position, so the loop draws no other random numbers), the consumed and
//! dropped sample counts ([`super::setup::Counters`]), and every rank's shards of the
//! weights with the AdamW state.

use super::error::TrainError;
use super::metrics::StepRecord;
use super::resolve::ResolvedRun;
use crate::train::eval::EvalReport;
use std::path::PathBuf;

/// Runs on rank 0 after every optimizer step, with that step's record (the same line
/// `metrics.jsonl` gets). An error stops the run.
pub trait StepHook {
    fn after_step(&mut self, plan: &ResolvedRun, step: &StepRecord) -> Result<(), TrainError>;
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub steps: usize,
    /// Loss of each step run in this call.
    pub losses: Vec<f64>,
    pub wall_s: f64,
    pub eval: Option<EvalReport>,
    /// Where the final model was written (`config.json` + `model.safetensors`).
    pub final_model: PathBuf,
    /// The last checkpoint this call saved, if any.
    pub last_checkpoint: Option<PathBuf>,
}

/// How many times a step's peak allocation the allocator may keep reserved before the loop
/// releases its cache: the caching allocator serves a request only from a cached block of
/// its rounded size or at most 1/8 larger, and the synthetic set's batches come in many
/// shapes (image sizes, padded lengths): without a release the cache grows by every new
/// shape (to ~10 GB over the default run for a 130 MB working set). Releasing it when it
/// holds more than this many times the step's peak keeps the steady-shape reuse and bounds
/// the memory.
pub const CACHE_SLACK: usize = 4;
