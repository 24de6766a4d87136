//! A saved run a rank starts from, as the rank sees it: AdamW's step and any range of any
//! group's weights or moments. The train tier's checkpoints implement these traits, so the
//! sharded rank reads a checkpoint without importing the tier above it.

use super::FsdpError;
use crate::model::ParamLayout;
use std::ops::Range;

/// Which of a group's saved tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The f32 master weights.
    Param,
    /// AdamW's first moment.
    ExpAvg,
    /// AdamW's second moment.
    ExpAvgSq,
}

/// Where a saved run is, opened by each rank for itself (the readers are the rank's own).
pub trait SavedRun: std::fmt::Debug + Sync {
    /// Opens the run for a model laid out by `layout` whose trained groups are `trains`: the
    /// saved layout and trained groups must be the model's. `values = false` (a meta rank):
    /// sizes only, no byte read.
    fn open(
        &self,
        layout: &ParamLayout,
        trains: &dyn Fn(usize) -> bool,
        values: bool,
    ) -> Result<Box<dyn SavedShards>, FsdpError>;
}

/// A saved run opened by one rank.
pub trait SavedShards {
    /// AdamW's step count the run saved.
    fn adam_step(&self) -> u64;

    /// Elements `range` of group `g`'s `kind` tensor into `dst` (of the range's length).
    fn read_into(
        &mut self,
        kind: Kind,
        g: usize,
        range: Range<usize>,
        dst: &mut [f32],
    ) -> Result<(), FsdpError>;
}
