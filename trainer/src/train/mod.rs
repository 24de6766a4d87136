//! Training: K optimizer steps of the Mistral3 model on a batch.
//!
//! Today this is the loop `cannon verify` checks against the reference fixture's
//! `train.*` rows ([`train_steps`]: forward, backward, global-norm clipping, AdamW); the
//! `cannon train` subcommand (data loader, schedule, checkpoints) will be built on it.

pub mod step;

pub use step::{train_steps, StepLog, TrainSettings};
