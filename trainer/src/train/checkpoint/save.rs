//! Saving: a checkpoint directory is written under a temporary name and renamed when complete.
//!
//! ```text
//! root/step-000123.tmp/    rank 0 creates it (after putting back or removing what a crashed
//!                          save left, CheckpointDir::recover)
//!   rank-*.safetensors     every rank writes and fsyncs its file
//!   config.json            rank 0, once every rank has written (fsynced)
//!   manifest.json          rank 0, last: written as manifest.json.partial, fsynced, the
//!                          directory fsynced, renamed, the directory fsynced: the marker
//!                          that the save is complete
//! root/step-000123.old/    a step-000123/ already there (a step saved twice) moves aside
//! root/step-000123/        rank 0 renames the directory and fsyncs the root; then removes
//!                          the .old
//! ```
//!
//! Wherever a crash stops this, the newest complete checkpoint is found: before the marker
//! the previous ones are the latest and the `.tmp` is a leftover; from the marker on, the
//! new one is, under whichever of its names it has ([`super::dir`]). A save that fails with
//! an error (a full disk) removes its unfinished `.tmp` and commits nothing. `keep_last`
//! prunes older complete checkpoints only after the new one is in place.

use super::dir::SaveStep;
use super::error::{io, CheckpointError, Result};
use super::manifest::{
    exp_avg_sq_tensor, exp_avg_tensor, param_tensor, rank_file, DataState, FileEntry, GroupEntry,
    Manifest, OptimizerState, CONFIG_FILE, FORMAT, MANIFEST_FILE, VERSION,
};
use super::CheckpointDir;
use crate::durable::{rename_synced, sync_dir, write_synced};
use crate::model::offload::Stored;
use crate::model::st::StReader;
use crate::model::st::{StDtype, StWriter, TensorSpec};
use cannon_kernels::Tensor;
use cannon_runtime::comm::{Communicator, ReduceOp};
use cannon_runtime::{DeviceBuffer, Stream};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The manifest's name until the save is complete.
const MANIFEST_PARTIAL: &str = "manifest.json.partial";

/// What every rank knows about the save (identical on all ranks).
#[derive(Clone, Debug)]
pub struct SaveMeta {
    /// Optimizer steps completed.
    pub step: u64,
    pub world_size: usize,
    /// The run's effective configuration.
    pub config: serde_json::Value,
    /// The model's HF `config.json` (see [`super::hf_config_json`] for a preset's).
    pub model_config: serde_json::Value,
    /// Groups with their per-rank ranges (`super::manifest::group_entries`).
    pub groups: Vec<GroupEntry>,
    pub optimizer: OptimizerState,
    pub scheduler: serde_json::Value,
    pub data: DataState,
    /// Small files written beside the manifest, `(name, contents)`: e.g. the run's TOML
    /// config, so that `cannon eval` finds it in the checkpoint.
    pub extra_files: Vec<(String, String)>,
    /// The largest |weight| a checkpoint may hold (`train.max_abs_weight`; infinity: no
    /// bound). Every tensor must be finite whatever the bound.
    pub max_abs_weight: f64,
}

/// Where a shard's values are: on the rank's device (copied to the host one tensor at a time
/// while the file is written), held by the trainer wherever it keeps them (on the device or
/// in its host pool: the optimizer offload), or already on the host.
#[derive(Clone, Copy, Debug)]
pub enum ShardData<'a> {
    Device(&'a Tensor<f32>),
    Stored(&'a Stored),
    Host(&'a [f32]),
}

impl<'a> ShardData<'a> {
    pub fn len(&self) -> usize {
        match self {
            ShardData::Device(t) => t.numel(),
            ShardData::Stored(t) => t.numel(),
            ShardData::Host(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn to_host(self, stream: &Stream) -> Result<Cow<'a, [f32]>> {
        Ok(match self {
            ShardData::Device(t) => Cow::Owned(t.to_host(stream)?),
            ShardData::Stored(t) => Cow::Owned(t.to_host(stream)?),
            ShardData::Host(v) => Cow::Borrowed(v),
        })
    }
}

/// One group's part of a rank: its `[stored]` shard of the master weights and, if the group
/// trains, of AdamW's moments.
#[derive(Clone, Copy, Debug)]
pub struct GroupShards<'a> {
    pub param: ShardData<'a>,
    pub exp_avg: Option<ShardData<'a>>,
    pub exp_avg_sq: Option<ShardData<'a>>,
}

/// One rank's tensors, one entry per group, and its random generator's state.
#[derive(Clone, Debug)]
pub struct RankShards<'a> {
    pub rank: usize,
    pub groups: Vec<GroupShards<'a>>,
    /// `SplitMix64::state` of the rank's generator.
    pub rng: u64,
}

impl<'a> RankShards<'a> {
    /// A rank's shards as device tensors: `params[g]`, and `exp_avg[g]` / `exp_avg_sq[g]`
    /// for the trained groups (the layout of `Params::data` and `AdamW::m`/`v`).
    pub fn device(
        rank: usize,
        params: &'a [Tensor<f32>],
        exp_avg: &'a [Option<Tensor<f32>>],
        exp_avg_sq: &'a [Option<Tensor<f32>>],
        rng: u64,
    ) -> Result<Self> {
        Self::of(rank, (params, exp_avg, exp_avg_sq), rng, ShardData::Device)
    }

    /// A rank's shards as the trainer holds them: `params[g]` (`Params::data`), and
    /// `exp_avg[g]` / `exp_avg_sq[g]` (`AdamW::m`/`v`) for the trained groups.
    pub fn stored(
        rank: usize,
        params: &'a [Stored],
        exp_avg: &'a [Option<Stored>],
        exp_avg_sq: &'a [Option<Stored>],
        rng: u64,
    ) -> Result<Self> {
        Self::of(rank, (params, exp_avg, exp_avg_sq), rng, ShardData::Stored)
    }

    /// Both constructors: per group its parameter shard and, when it trains, its moments,
    /// each seen through `data`.
    fn of<T>(
        rank: usize,
        (params, exp_avg, exp_avg_sq): (&'a [T], &'a [Option<T>], &'a [Option<T>]),
        rng: u64,
        data: fn(&'a T) -> ShardData<'a>,
    ) -> Result<Self> {
        if exp_avg.len() != params.len() || exp_avg_sq.len() != params.len() {
            return Err(CheckpointError::Argument(format!(
                "rank {rank}: {} parameter, {} exp_avg and {} exp_avg_sq groups",
                params.len(),
                exp_avg.len(),
                exp_avg_sq.len()
            )));
        }
        let groups = params
            .iter()
            .zip(exp_avg.iter().zip(exp_avg_sq))
            .map(|(p, (m, v))| GroupShards {
                param: data(p),
                exp_avg: m.as_ref().map(data),
                exp_avg_sq: v.as_ref().map(data),
            })
            .collect();
        Ok(RankShards { rank, groups, rng })
    }
}

/// A save under way: where it writes and where it lands.
#[derive(Debug)]
pub struct PendingSave {
    step: u64,
    world: usize,
    tmp: PathBuf,
    dest: PathBuf,
    /// The folder it commits into (and, in tests, the fault to stop at).
    dir: CheckpointDir,
}

impl CheckpointDir {
    /// Rank 0, before any rank writes: puts back the complete copies crashed saves left
    /// under other names, removes the leftovers (freeing their space), and creates
    /// `step-N.tmp/`.
    pub fn begin(&self, step: u64, world: usize) -> Result<PendingSave> {
        let p = self.pending(step, world);
        std::fs::create_dir_all(self.root()).map_err(io(self.root()))?;
        self.recover()?;
        self.remove_leftovers()?;
        std::fs::create_dir(&p.tmp).map_err(io(&p.tmp))?;
        Ok(p)
    }

    /// The handle of a save rank 0 has begun, for the other ranks (touches nothing).
    pub fn pending(&self, step: u64, world: usize) -> PendingSave {
        PendingSave {
            step,
            world,
            tmp: self.tmp_path(step),
            dest: self.path(step),
            dir: self.clone(),
        }
    }
}

impl PendingSave {
    /// Where the files are being written.
    pub fn tmp_dir(&self) -> &Path {
        &self.tmp
    }

    /// Where the checkpoint lands on commit.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    fn check_meta(&self, meta: &SaveMeta) -> Result<()> {
        if meta.step != self.step || meta.world_size != self.world {
            return Err(CheckpointError::Argument(format!(
                "save of step {} over {} ranks given metadata of step {} over {}",
                self.step, self.world, meta.step, meta.world_size
            )));
        }
        Ok(())
    }

    /// Writes rank `shards.rank`'s file (device -> host one tensor at a time) and fsyncs it.
    pub fn write_rank(
        &self,
        meta: &SaveMeta,
        shards: &RankShards<'_>,
        stream: &Stream,
    ) -> Result<()> {
        self.check_meta(meta)?;
        let rank = shards.rank;
        let n = meta.groups.len();
        if rank >= self.world {
            return Err(CheckpointError::Argument(format!(
                "rank {rank} in a world of {}",
                self.world
            )));
        }
        if shards.groups.len() != n {
            return Err(CheckpointError::Argument(format!(
                "rank {rank}: {} groups of tensors for {n} groups",
                shards.groups.len()
            )));
        }
        let mut specs = Vec::new();
        let mut sources: Vec<ShardData<'_>> = Vec::new();
        // Per tensor: whether it is a weight, and its elements before the padding (which
        // nothing reads back, so nothing checks).
        let mut is_param = Vec::new();
        let mut valid = Vec::new();
        for (entry, gs) in meta.groups.iter().zip(&shards.groups) {
            let stored = entry.shards[rank].stored;
            let tensors = match (entry.trained, gs.exp_avg, gs.exp_avg_sq) {
                (true, Some(m), Some(v)) => vec![
                    (param_tensor(&entry.name), gs.param),
                    (exp_avg_tensor(&entry.name), m),
                    (exp_avg_sq_tensor(&entry.name), v),
                ],
                (false, None, None) => vec![(param_tensor(&entry.name), gs.param)],
                (_, m, v) => {
                    return Err(CheckpointError::Argument(format!(
                        "rank {rank}: group {} {} but its moments are {}",
                        entry.name,
                        if entry.trained { "trains" } else { "is frozen" },
                        match (m, v) {
                            (Some(_), Some(_)) => "present",
                            (None, None) => "absent",
                            _ => "half present",
                        }
                    )))
                }
            };
            for (name, t) in tensors {
                if t.len() != stored {
                    return Err(CheckpointError::Argument(format!(
                        "rank {rank}: {name} has {} elements, its shard stores {stored}",
                        t.len()
                    )));
                }
                is_param.push(name == param_tensor(&entry.name));
                valid.push(entry.shards[rank].len());
                specs.push(TensorSpec {
                    name,
                    dtype: StDtype::F32,
                    shape: vec![stored],
                });
                sources.push(t);
            }
        }
        let metadata = BTreeMap::from([
            ("format".to_string(), FORMAT.to_string()),
            ("version".to_string(), VERSION.to_string()),
            ("step".to_string(), self.step.to_string()),
            ("rank".to_string(), rank.to_string()),
            ("world_size".to_string(), self.world.to_string()),
            ("rng".to_string(), shards.rng.to_string()),
        ]);
        let path = self.tmp.join(rank_file(rank, self.world));
        let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
        let mut w = StWriter::create(&path, specs, &metadata)?;
        // A meta device's values do not exist: the file gets its header and size alone.
        if stream.device().is_meta() {
            w = w.without_data();
        }
        let meta_device = stream.device().is_meta();
        for (i, t) in sources.iter().enumerate() {
            self.dir.fault_at(SaveStep::RankTensor(i))?;
            let host = t.to_host(stream)?;
            if !meta_device {
                let bound = if is_param[i] {
                    meta.max_abs_weight
                } else {
                    f64::INFINITY
                };
                let n = valid[i].min(host.len());
                self.check_values(&names[i], &host[..n], bound)?;
            }
            w.write_f32(&host)?;
        }
        w.finish()?;
        Ok(())
    }

    /// Refuses a tensor with a non-finite value or an element past `bound` in magnitude.
    fn check_values(&self, tensor: &str, values: &[f32], bound: f64) -> Result<()> {
        let unsafe_ = |what: String| CheckpointError::Unsafe {
            step: self.step,
            tensor: tensor.to_string(),
            what,
        };
        let mut worst = 0f32;
        for (i, &x) in values.iter().enumerate() {
            if !x.is_finite() {
                return Err(unsafe_(format!(
                    "holds {x} at element {i} of this rank's shard"
                )));
            }
            worst = worst.max(x.abs());
        }
        if f64::from(worst) > bound {
            return Err(unsafe_(format!(
                "holds a weight of magnitude {worst:e}, past train.max_abs_weight = {bound:e} \
                 (the run has diverged)"
            )));
        }
        Ok(())
    }

    /// Rank 0, once every rank's file is written: checks the files, writes `config.json` and
    /// the manifest, fsyncs, and renames the directory into place. Returns the checkpoint's
    /// directory.
    pub fn commit(self, meta: &SaveMeta) -> Result<PathBuf> {
        self.check_meta(meta)?;
        let mut files = Vec::with_capacity(self.world);
        let mut rng = Vec::with_capacity(self.world);
        for rank in 0..self.world {
            let file = rank_file(rank, self.world);
            let path = self.tmp.join(&file);
            let r = StReader::open(&path)?;
            let md = |k: &str| r.metadata().get(k).cloned().unwrap_or_default();
            if md("step") != self.step.to_string() || md("rank") != rank.to_string() {
                return Err(CheckpointError::Shard {
                    path,
                    reason: format!(
                        "written for step {} rank {}, expected step {} rank {rank}",
                        md("step"),
                        md("rank"),
                        self.step
                    ),
                });
            }
            rng.push(
                md("rng")
                    .parse::<u64>()
                    .map_err(|e| CheckpointError::Shard {
                        path: path.clone(),
                        reason: format!("bad rng metadata: {e}"),
                    })?,
            );
            let bytes = std::fs::metadata(&path).map_err(io(&path))?.len();
            files.push(FileEntry { rank, file, bytes });
        }
        let manifest = Manifest {
            format: FORMAT.into(),
            version: VERSION,
            step: self.step,
            world_size: self.world,
            config: meta.config.clone(),
            groups: meta.groups.clone(),
            optimizer: meta.optimizer.clone(),
            scheduler: meta.scheduler.clone(),
            rng,
            data: meta.data,
            files,
        };
        manifest.check()?;
        let pretty = |v: &serde_json::Value| serde_json::to_vec_pretty(v).unwrap_or_default();
        write_synced(&self.tmp.join(CONFIG_FILE), &pretty(&meta.model_config))?;
        for (name, text) in &meta.extra_files {
            let reserved =
                name == CONFIG_FILE || name == MANIFEST_FILE || name.ends_with(".safetensors");
            if reserved || name.is_empty() || name.contains('/') || name.contains("..") {
                return Err(CheckpointError::Argument(format!(
                    "extra checkpoint file name {name:?} is reserved or leaves the directory"
                )));
            }
            write_synced(&self.tmp.join(name), text.as_bytes())?;
        }
        self.dir.fault_at(SaveStep::FilesWritten)?;
        let text = serde_json::to_vec_pretty(&manifest).map_err(|e| CheckpointError::Manifest {
            path: self.tmp.join(MANIFEST_FILE),
            reason: e.to_string(),
        })?;
        // The marker of a complete save: every other file and its entry are durable before
        // `manifest.json` appears, and it appears whole (a rename).
        let partial = self.tmp.join(MANIFEST_PARTIAL);
        write_synced(&partial, &text)?;
        sync_dir(&self.tmp)?;
        self.dir.fault_at(SaveStep::ManifestWritten)?;
        rename_synced(&partial, &self.tmp.join(MANIFEST_FILE))?;
        self.dir.fault_at(SaveStep::Marked)?;
        let dir = &self.dir;
        dir.install(&self.tmp, self.step, |s| dir.fault_at(s))
    }
}

/// Saves every rank's shards from one thread (one rank, or tests holding all ranks), then
/// prunes to the newest `keep_last` complete checkpoints (0 keeps all).
pub fn save_local(
    dir: &CheckpointDir,
    meta: &SaveMeta,
    ranks: &[RankShards<'_>],
    stream: &Stream,
    keep_last: usize,
) -> Result<PathBuf> {
    if ranks.len() != meta.world_size || ranks.iter().enumerate().any(|(r, s)| s.rank != r) {
        return Err(CheckpointError::Argument(format!(
            "{} rank shards for a world of {} (they must be ranks 0.. in order)",
            ranks.len(),
            meta.world_size
        )));
    }
    let saved = dir.begin(meta.step, meta.world_size).and_then(|pending| {
        for shards in ranks {
            pending.write_rank(meta, shards, stream)?;
        }
        pending.commit(meta)
    });
    let path = saved.map_err(|e| failed(dir, meta.step, e))?;
    dir.prune(keep_last)?;
    Ok(path)
}

/// A save that failed: its unfinished `.tmp` is removed (a full disk gets its space back)
/// and the error told as running out of space when it was. A crash a test injects leaves
/// everything as a killed process would.
fn failed(dir: &CheckpointDir, step: u64, e: CheckpointError) -> CheckpointError {
    #[cfg(test)]
    if matches!(e, CheckpointError::Injected(_)) {
        return e;
    }
    dir.discard_unfinished(step);
    e.of_save(step)
}

/// Whether every rank succeeded: an all-reduce (max) of each rank's failure flag, so that a
/// rank that failed stops the others from committing instead of leaving them waiting. An
/// i32: HCCL reduces signed integers and floats, not uint32 (`HCCL_E_NOT_SUPPORT`).
fn agree(comm: &Communicator, stream: &Stream, failed: bool) -> Result<bool> {
    let mut flag = DeviceBuffer::clone_htod(stream, &[i32::from(failed)])?;
    comm.all_reduce_in_place(&mut flag.view_mut(), ReduceOp::Max, stream)?;
    Ok(flag.clone_dtoh(stream)?[0] == 0)
}

/// Saves this rank's shards as one of `comm`'s ranks: rank 0 begins, every rank writes its
/// file, rank 0 commits and prunes. Every rank calls it with the same `meta`; every rank
/// returns the checkpoint's path, or an error on every rank if any rank failed.
pub fn save_distributed(
    dir: &CheckpointDir,
    meta: &SaveMeta,
    mine: &RankShards<'_>,
    comm: &Communicator,
    stream: &Stream,
    keep_last: usize,
) -> Result<PathBuf> {
    let (rank, world) = (comm.rank(), comm.world_size());
    if mine.rank != rank || meta.world_size != world {
        return Err(CheckpointError::Argument(format!(
            "rank {rank} of {world} saving shards of rank {} of {}",
            mine.rank, meta.world_size
        )));
    }
    let begun = if rank == 0 {
        dir.begin(meta.step, world).map(|_| ())
    } else {
        Ok(())
    };
    // Keep our own error to return it; the peers learn only that someone failed.
    // A failure anywhere: rank 0 removes the unfinished save (every rank is past writing).
    let fail = |e: Option<CheckpointError>| {
        let e = e.unwrap_or(CheckpointError::PeerFailed { step: meta.step });
        if rank == 0 {
            failed(dir, meta.step, e)
        } else {
            e.of_save(meta.step)
        }
    };
    let mut mine_err = begun.err();
    if !agree(comm, stream, mine_err.is_some())? {
        return Err(fail(mine_err));
    }
    let pending = dir.pending(meta.step, world);
    mine_err = pending.write_rank(meta, mine, stream).err();
    if !agree(comm, stream, mine_err.is_some())? {
        return Err(fail(mine_err));
    }
    let committed = if rank == 0 {
        pending
            .commit(meta)
            .map_err(|e| failed(dir, meta.step, e))
            .and_then(|p| dir.prune(keep_last).map(|_| p))
    } else {
        Ok(dir.path(meta.step))
    };
    let (path, err) = match committed {
        Ok(p) => (Some(p), None),
        Err(e) => (None, Some(e)),
    };
    if !agree(comm, stream, err.is_some())? {
        return Err(err.unwrap_or(CheckpointError::PeerFailed { step: meta.step }));
    }
    Ok(path.unwrap_or_else(|| dir.path(meta.step)))
}
