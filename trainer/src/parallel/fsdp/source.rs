//! Where a rank's shards come from at start-up: each rank reads or draws only its own
//! elements of every group, so no process ever holds the whole model.
//!
//! ```text
//! Full        host groups of the whole model (tests, a model already in memory): cut
//! Random      drawn per element from the seed and the global index (model::init): any world
//!             size gives the same weights
//! Weights     an HF checkpoint: the bytes of the rank's ranges only (model::weights)
//! Checkpoint  a saved run (a cannon checkpoint saved over any world size, [`super::saved`]):
//!             the rank's slices of the weights, and of the AdamW moments of the groups it
//!             trains, with AdamW's step
//! ```
//!
//! A shard is read into host memory one group at a time (the rank's `[shard]` of that group,
//! then stored where the rank keeps it), so start-up holds at most one group's shard on the
//! host beside what the rank keeps. A CPU rank keeps its shards in host memory already: it
//! reads each straight into the tensor that keeps it, and writes its zeros on a second
//! thread meanwhile (`born_on_host`).

use super::saved::{Kind, SavedRun, SavedShards};
use super::shard::{GroupShard, ShardLayout};
use super::FsdpError;
use crate::model::init::{self, Init};
use crate::model::weights::HfWeights;
use crate::model::{DeviceCtx, ParamLayout};
use cannon_kernels::Tensor;
use cannon_runtime::DeviceBuffer;
use std::ops::Range;
use std::sync::mpsc::sync_channel;
use std::sync::Mutex;

/// Where a rank's shards come from (see the module docs).
#[derive(Clone, Copy, Debug)]
pub enum ShardSource<'a> {
    /// Host groups of the whole model, one `Vec` per group of the layout.
    Full(&'a [Vec<f32>]),
    /// Random initialisation (see [`crate::model::init`]).
    Random { seed: u64, init: Init },
    /// An opened HF checkpoint.
    Weights(&'a HfWeights),
    /// A saved run: a cannon checkpoint directory (or a folder of them: its latest), which
    /// the train tier opens.
    Checkpoint(&'a dyn SavedRun),
}

/// A source opened by one rank: [`ShardSource::Checkpoint`] opens its files per rank (their
/// readers are the rank's own).
pub(super) enum Reader<'a> {
    Source(ShardSource<'a>),
    Checkpoint(Box<dyn SavedShards>),
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
            ShardSource::Checkpoint(saved) => {
                Ok(Reader::Checkpoint(saved.open(layout, trains, values)?))
            }
            ShardSource::Random { .. } if !values => Ok(Reader::Sizes),
            _ => Ok(Reader::Source(source)),
        }
    }

    /// AdamW's step count the source holds (0: none, training starts).
    pub(super) fn adam_step(&self) -> u64 {
        match self {
            Reader::Checkpoint(c) => c.adam_step(),
            Reader::Source(_) | Reader::Sizes => 0,
        }
    }

    /// Whether the source holds `kind` tensors (a checkpoint: weights and moments; any other
    /// source: weights only, the moments start at zero).
    pub(super) fn holds(&self, kind: Kind) -> bool {
        matches!((self, kind), (Reader::Checkpoint(_), _) | (_, Kind::Param))
    }

    /// Rank `rank`'s `[shard]` of group `g`'s `kind` tensor into `dst` (`cut.shard` values,
    /// whatever they held: the padding past the group's end is written with zeros), for a
    /// kind the source [`Self::holds`]. A rank whose shards live in host memory reads them
    /// here straight into the tensors that keep them.
    pub(super) fn shard_into(
        &mut self,
        layout: &ParamLayout,
        kind: Kind,
        g: usize,
        cut: GroupShard,
        rank: usize,
        dst: &mut [f32],
    ) -> Result<(), FsdpError> {
        if dst.len() != cut.shard || !self.holds(kind) {
            return Err(FsdpError::Invalid(format!(
                "group {g}: a {kind:?} shard of {} values read into {} (held: {})",
                cut.shard,
                dst.len(),
                self.holds(kind)
            )));
        }
        let valid = cut.valid(rank);
        let (dst, pad) = dst.split_at_mut(valid.len());
        pad.fill(0.0);
        match (self, kind) {
            (Reader::Checkpoint(c), _) => c.read_into(kind, g, valid, dst)?,
            // Sizes only: the values are never read (a meta rank has none to hold).
            (Reader::Sizes, _) => {}
            (Reader::Source(s), _) => read_param(*s, layout, g, valid, dst)?,
        }
        Ok(())
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

/// A CPU rank's tensors made at start-up: its `[shard]` weights of every group, and for the
/// trained groups its AdamW moments and gradient (None for a frozen group).
pub(super) struct HostBirth {
    pub(super) params: Vec<Tensor<f32>>,
    pub(super) m: Vec<Option<Tensor<f32>>>,
    pub(super) v: Vec<Option<Tensor<f32>>>,
    pub(super) grads: Vec<Option<Tensor<f32>>>,
}

/// The tensors of rank `rank` of a CPU rank whose shards live in its own allocator's host
/// memory, each read straight into the tensor that keeps it (no host copy to upload from).
///
/// Every tensor is allocated first, on this thread (the rank's: its memory figures, its
/// host bytes). A second thread then makes their pages resident, which is where the time
/// goes besides the reads: the kernel zeroes every page of fresh memory on its first touch,
/// 13.7 GB for a 1B model's weights, gradients and moments against 3.5 GB read. It first
/// faults in the tensors to be read, in the order this thread reads them, and hands each
/// over as it is ready, so this thread only copies (and waits for the disk on a cold
/// read); then it writes the zeros (the gradients, and the moments the source does not
/// hold, [`cannon_runtime::Pending::zero`]), which this thread joins when its reads are
/// done. On two cores a cold read's waits and the zeroing overlap instead of adding up.
/// The second thread allocates nothing: no memory figure moves between threads.
pub(super) fn born_on_host(
    reader: &mut Reader<'_>,
    exec: &DeviceCtx,
    layout: &ParamLayout,
    cut: &ShardLayout,
    rank: usize,
    trains: &dyn Fn(usize) -> bool,
) -> Result<HostBirth, FsdpError> {
    let (alloc, stream) = (exec.allocator(), exec.stream());
    let groups = layout.groups.len();
    // Slot 4 g + i of group g: i = 0 weights, 1 first moment, 2 second moment, 3 gradient.
    let slot = |g: usize, i: usize| 4 * g + i;
    let mut reads = Vec::new();
    let mut zeros = Vec::new();
    for g in 0..groups {
        let shard = cut.groups[g].shard;
        let kinds = [Kind::Param, Kind::ExpAvg, Kind::ExpAvgSq];
        for (i, kind) in kinds.into_iter().enumerate() {
            if i > 0 && !trains(g) {
                continue;
            }
            let buf = DeviceBuffer::<f32>::alloc_pending(alloc, stream, shard)?;
            match reader.holds(kind) {
                true => reads.push((kind, g, slot(g, i), buf)),
                false => zeros.push((slot(g, i), buf)),
            }
        }
        if trains(g) {
            let buf = DeviceBuffer::alloc_pending(alloc, stream, shard)?;
            zeros.push((slot(g, 3), buf));
        }
    }
    let made: Vec<Mutex<Option<DeviceBuffer<f32>>>> =
        (0..slot(groups, 0)).map(|_| Mutex::new(None)).collect();
    // Room for every tensor to be read: the faulting thread never waits for the reader.
    let (ready, to_read) = sync_channel(reads.len());
    // The zeros in jobs of one tensor each, taken by whichever thread is free.
    let jobs = Mutex::new(zeros.into_iter());
    let zero_all = || -> Result<(), FsdpError> {
        loop {
            let job = lock(&jobs)?.next();
            let Some((at, z)) = job else {
                return Ok(());
            };
            *lock(&made[at])? = Some(z.zero(stream)?);
        }
    };
    std::thread::scope(|s| -> Result<(), FsdpError> {
        let pages = s.spawn(move || {
            for (kind, g, at, buf) in reads {
                // The reader has stopped (it failed): the zeros are not needed either.
                if ready.send((kind, g, at, buf.prefault())).is_err() {
                    return Ok(());
                }
            }
            drop(ready);
            zero_all()
        });
        let mut read_all = || -> Result<(), FsdpError> {
            for (kind, g, at, mut buf) in to_read.iter() {
                let dst = buf.as_host_slice_mut()?;
                reader.shard_into(layout, kind, g, cut.groups[g], rank, dst)?;
                *lock(&made[at])? = Some(buf);
            }
            zero_all()
        };
        let here = read_all();
        if here.is_err() {
            // The start-up fails: the other thread stops after its current tensor.
            drop(to_read);
            if let Ok(mut left) = jobs.lock() {
                left.by_ref().for_each(drop);
            }
        }
        let there = match pages.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        here.and(there)
    })?;
    let mut made = made
        .into_iter()
        .map(|m| m.into_inner().map_err(|_| poisoned()));
    let mut out = HostBirth {
        params: Vec::with_capacity(groups),
        m: Vec::with_capacity(groups),
        v: Vec::with_capacity(groups),
        grads: Vec::with_capacity(groups),
    };
    for g in 0..groups {
        let mut next = || -> Result<Option<Tensor<f32>>, FsdpError> {
            match made.next().transpose()?.flatten() {
                Some(buf) => {
                    let n = buf.len();
                    Ok(Some(Tensor::from_buffer(buf, &[n])?))
                }
                None => Ok(None),
            }
        };
        let p = next()?.ok_or_else(|| FsdpError::Invalid(format!("group {g}: no weights")))?;
        out.params.push(p);
        out.m.push(next()?);
        out.v.push(next()?);
        out.grads.push(next()?);
    }
    Ok(out)
}

fn poisoned() -> FsdpError {
    FsdpError::Invalid("a start-up thread panicked while writing a rank's zeros".into())
}

fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>, FsdpError> {
    m.lock().map_err(|_| poisoned())
}
