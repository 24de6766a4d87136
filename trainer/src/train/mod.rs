//! Training: the loop of `cannon train` and the steps it is made of.
//!
//! - `settings`: what the step is given besides the model and the batch
//!   ([`TrainSettings`], the memory features of `[train]`).
//! - `schedule`: warm-up + cosine or constant learning rate.
//! - [`resolve`]: a config resolved into paths, a model source and a freeze list
//!   ([`resolve::ResolvedRun`]).
//! - [`samples`]: what a run's samples are made with ([`samples::SampleSetup`]: the tokenizer
//!   and vocabulary, the image settings and the system prompt, from a preset or the model
//!   folder).
//! - [`setup`]: a run made ready without its model ([`setup::RunSetup`]): what the ranks
//!   start from, each reading or drawing its own shards.
//! - [`sharded`]: the one driver loop, for every world size: one process alone (a world of
//!   one), N in-process CPU ranks, or this process's rank of a launched job; each step is
//!   [`crate::parallel::fsdp::FsdpRank::step`].
//! - `run`: what a run reports ([`run::RunSummary`]) and the hook run after every step
//!   ([`run::StepHook`]); `error`: how it fails ([`TrainError`]).
//! - [`run_dir`]: one run per run folder (another run there is refused, continued, or moved
//!   aside with `--force`).
//! - [`resume`]: every rank's part of a checkpoint, and resuming a run from one;
//!   [`preempt`]: a checkpoint and a distinct exit on SIGTERM or SIGINT.
//! - [`metrics`], [`flops`], [`identity`], [`digest`]: what a run reports and records;
//!   [`tensorboard`]: its metrics as TensorBoard event files (`log.tensorboard`).
//! - [`config`]: the TOML run config of `cannon train` and the built-in model presets.
//! - [`data`]: the data pipeline (Tekken tokenizer, chat template, Pixtral images, batches).
//! - [`checkpoint`]: sharded checkpoints (one safetensors file per rank + a JSON manifest),
//!   written atomically, resumed bit for bit, resharded, and exported as an HF checkpoint.
//! - [`eval`]: held-out greedy accuracy per question type of the synthetic shapes set.

pub mod checkpoint;
pub mod config;
pub mod data;
pub mod digest;
pub(crate) mod error;
pub mod eval;
pub mod flops;
pub mod identity;
pub mod metrics;
pub mod preempt;
pub mod resolve;
pub mod resume;
pub(crate) mod run;
pub mod run_dir;
pub mod samples;
pub(crate) mod schedule;
pub(crate) mod settings;
pub mod setup;
pub mod sharded;
pub mod tensorboard;

pub use error::TrainError;
pub use resolve::ResolvedRun;
pub use run::{RunSummary, StepHook};
pub use schedule::LrSchedule;
pub use settings::{memory_features, TrainSettings};
pub use setup::RunSetup;
