//! Training: the loop of `cannon train` and the steps it is made of.
//!
//! - [`step`]: one optimizer step's pieces: [`accumulate`] (micro batches into one step's
//!   gradients, the loss normalised over all their targets) and [`train_steps`] (K AdamW
//!   steps on one batch, what `cannon verify` checks against the reference fixture).
//! - [`schedule`]: warm-up + cosine or constant learning rate.
//! - [`run_plan`]: a config resolved into paths, a model source and a freeze list
//!   ([`run_plan::RunPlan`]).
//! - [`setup`]: a run made ready without its model ([`setup::RunSetup`]): what both a
//!   one-process run and the ranks of a sharded one start from.
//! - [`run`]: the one-process run: the state a checkpoint holds ([`run::TrainState`]), the loop
//!   ([`run::Trainer::run`]) with a hook after every step ([`run::StepHook`]), the final
//!   evaluation.
//! - [`resume`]: saving checkpoints from the loop ([`resume::CheckpointHook`]) and resuming
//!   a run from one.
//! - [`sharded`]: the run on `parallel.nproc` CPU ranks of an FSDP run.
//! - [`metrics`], [`flops`], [`identity`], [`digest`]: what a run reports and records.

pub mod digest;
pub mod flops;
pub mod identity;
pub mod metrics;
pub mod resume;
pub mod run;
pub mod run_plan;
pub mod schedule;
pub mod setup;
pub mod sharded;
pub mod step;

pub use run::{RunSummary, StepHook, TrainError, TrainState, Trainer};
pub use run_plan::RunPlan;
pub use schedule::LrSchedule;
pub use setup::RunSetup;
pub use step::{accumulate, memory_features, train_steps, Accumulated, StepLog, TrainSettings};
