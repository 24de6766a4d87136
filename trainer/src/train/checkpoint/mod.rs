//! Sharded checkpoints, exact resume, and export to Hugging Face safetensors.
//!
//! A checkpoint is a directory `step-<N>/` holding one safetensors file per rank (the rank's
//! shard of every flat parameter group as f32 master weights, and AdamW's `exp_avg` /
//! `exp_avg_sq` shards of the groups that train), the model's `config.json`, and a JSON
//! [`Manifest`] (step, the run's config, world size, the group layout with each rank's range
//! and padding, optimizer and scheduler state, RNG states, data position, consumed and dropped
//! samples, format version). One rank is the N = 1 case of the same format.
//!
//! - Saving (`save`) writes `step-<N>.tmp/` and renames it when complete, manifest last and
//!   fsynced: a crash anywhere in a save leaves the newest complete checkpoint the one found,
//!   put back in place by the next save ([`CheckpointDir`]), and `keep_last` prunes older
//!   ones.
//! - Loading ([`Checkpoint`]) reads any element range of any group from whichever rank files
//!   hold it, so a run on another world size takes its own shards (resharding), and a one-rank
//!   run or an export consolidates.
//! - [`Snapshot`] is a one-rank run's whole state; restoring it continues the run bit for bit.
//! - [`export()`] writes the consolidated weights as an HF checkpoint.

pub(crate) mod dir;
pub(crate) mod error;
pub(crate) mod export;
pub(crate) mod hf_config;
pub(crate) mod load;
pub(crate) mod manifest;
pub(crate) mod rank_start;
pub(crate) mod save;
pub(crate) mod state;

pub use crate::parallel::fsdp::Kind;
pub use dir::{resolve, CheckpointDir};
pub use error::{CheckpointError, Result};
pub use export::{
    export, parse_size, parse_size_arg, torch_dtype_name, ExportOptions, ExportReport,
};
pub use hf_config::hf_config_json;
pub use load::Checkpoint;
pub use manifest::{padded_shards, DataState, Manifest, ShardRange};
pub use save::{
    save_distributed, save_local, GroupShards, PendingSave, RankShards, SaveMeta, ShardData,
};
pub use state::{one_rank_meta, restore_one_rank, save_one_rank, Progress, Snapshot};

#[cfg(test)]
mod tests;
