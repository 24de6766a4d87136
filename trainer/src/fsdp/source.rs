//! Where a rank's shards come from at start-up: each rank reads or draws only its own
//! elements of every group, so no process ever holds the whole model.
//!
//! ```text
//! Full        host groups of the whole model (tests, a model already in memory): cut
//! Random      drawn per element from the seed and the global index (model::init): any world
//!             size gives the same weights
//! Weights     an HF checkpoint: the bytes of the rank's ranges only (model::weights)
//! Checkpoint  a cannon checkpoint saved over any world size: the rank's slices of the
//!             weights, and of the AdamW moments of the groups it trains, with AdamW's step
//! ```
//!
//! A shard is read into host memory one group at a time (the rank's `[shard]` of that group,
//! then stored where the rank keeps it), so start-up holds at most one group's shard on the
//! host beside what the rank keeps.

use super::shard::GroupShard;
use super::FsdpError;
use crate::checkpoint::{Checkpoint, Kind};
use crate::model::init::{self, Init};
use crate::model::weights::HfWeights;
use crate::model::ParamLayout;
use std::ops::Range;
use std::path::Path;

/// Where a rank's shards come from (see the module docs).
#[derive(Clone, Copy, Debug)]
pub enum ShardSource<'a> {
    /// Host groups of the whole model, one `Vec` per group of the layout.
    Full(&'a [Vec<f32>]),
    /// Random initialisation (see [`crate::model::init`]).
    Random { seed: u64, init: Init },
    /// An opened HF checkpoint.
    Weights(&'a HfWeights),
    /// A cannon checkpoint directory (or a folder of them: its latest).
    Checkpoint(&'a Path),
}

/// A source opened by one rank: [`ShardSource::Checkpoint`] opens its files per rank (their
/// readers are the rank's own).
pub(super) enum Reader<'a> {
    Source(ShardSource<'a>),
    Checkpoint(Box<Checkpoint>),
    /// For a meta rank, whose shards have sizes and no values: random values are not
    /// drawn, a checkpoint is read for sizes only (its manifest, files
    /// and ranges checked, no byte read), and HF weights are read as the caller opened
    /// them ([`HfWeights::without_data`] for sizes only).
    Sizes,
}

impl<'a> Reader<'a> {
    /// Opens `source` for a model laid out by `layout` whose trained groups are `trains`:
    /// a checkpoint's layout and trained groups must be the model's.
    /// `values = false` (a meta rank): sizes only.
    pub(super) fn open(
        source: ShardSource<'a>,
        layout: &ParamLayout,
        trains: &dyn Fn(usize) -> bool,
        values: bool,
    ) -> Result<Self, FsdpError> {
        let bad = |e: crate::checkpoint::CheckpointError| FsdpError::Invalid(e.to_string());
        match source {
            ShardSource::Full(full) => {
                if full.len() != layout.groups.len() {
                    return Err(FsdpError::Invalid(format!(
                        "{} parameter groups given, the model has {}",
                        full.len(),
                        layout.groups.len()
                    )));
                }
                Ok(Reader::Source(source))
            }
            ShardSource::Checkpoint(path) => {
                let ckpt = Checkpoint::open(path).map_err(bad)?;
                ckpt.manifest().check_layout(layout).map_err(bad)?;
                // A rank that trains nothing (an evaluation) reads the weights alone, whatever
                // the checkpoint trained; a training rank must train what it trained.
                let training = (0..layout.groups.len()).any(trains);
                for (g, entry) in ckpt.manifest().groups.iter().enumerate() {
                    if !training {
                        break;
                    }
                    let now = trains(g);
                    if entry.trained != now {
                        return Err(FsdpError::Invalid(format!(
                            "{}: group {} {} in the checkpoint but {} now (the freeze list \
                             changed?)",
                            ckpt.dir().display(),
                            entry.name,
                            if entry.trained {
                                "trained"
                            } else {
                                "was frozen"
                            },
                            if now { "trains" } else { "is frozen" },
                        )));
                    }
                }
                let ckpt = if values { ckpt } else { ckpt.without_data() };
                Ok(Reader::Checkpoint(Box::new(ckpt)))
            }
            ShardSource::Random { .. } if !values => Ok(Reader::Sizes),
            _ => Ok(Reader::Source(source)),
        }
    }

    /// AdamW's step count the source holds (0: none, training starts).
    pub(super) fn adam_step(&self) -> u64 {
        match self {
            Reader::Checkpoint(c) => c.manifest().optimizer.step,
            Reader::Source(_) | Reader::Sizes => 0,
        }
    }

    /// Rank `rank`'s `[shard]` of group `g`'s `kind` tensor (zero padded past the group's
    /// end); None for moments the source does not hold (training starts them at zero).
    pub(super) fn shard(
        &mut self,
        layout: &ParamLayout,
        kind: Kind,
        g: usize,
        cut: GroupShard,
        rank: usize,
    ) -> Result<Option<Vec<f32>>, FsdpError> {
        let valid = cut.valid(rank);
        let mut out = vec![0.0f32; cut.shard];
        let dst = &mut out[..valid.len()];
        match (self, kind) {
            (Reader::Checkpoint(c), _) => c
                .read_into(kind, g, valid, dst)
                .map_err(|e| FsdpError::Invalid(e.to_string()))?,
            (Reader::Source(_) | Reader::Sizes, Kind::ExpAvg | Kind::ExpAvgSq) => return Ok(None),
            (Reader::Sizes, Kind::Param) => {}
            (Reader::Source(s), Kind::Param) => read_param(*s, layout, g, valid, dst)?,
        }
        Ok(Some(out))
    }
}

/// Elements `range` of group `g`'s weights from a source without optimizer state.
fn read_param(
    source: ShardSource<'_>,
    layout: &ParamLayout,
    g: usize,
    range: Range<usize>,
    dst: &mut [f32],
) -> Result<(), FsdpError> {
    match source {
        ShardSource::Full(full) => {
            let group = &full[g];
            if group.len() != layout.groups[g].len {
                return Err(FsdpError::Invalid(format!(
                    "group {g}: {} values for a group of {}",
                    group.len(),
                    layout.groups[g].len
                )));
            }
            dst.copy_from_slice(&group[range]);
        }
        ShardSource::Random { seed, init } => {
            init::random_range_into(layout, g, range, seed, init, dst)?;
        }
        ShardSource::Weights(w) => w
            .read_into(g, range, dst)
            .map_err(crate::model::ModelError::from)?,
        ShardSource::Checkpoint(_) => {
            return Err(FsdpError::Invalid(
                "a checkpoint source is read through its opened reader".into(),
            ))
        }
    }
    Ok(())
}
