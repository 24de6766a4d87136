//! One rank of a sharded data-parallel run: its shards, its optimizer state and its step.
//!
//! ```text
//! step(micro batches of this rank, lr):
//!   all-reduce   trained targets, tokens, bad batches (sum); passes, images per pass (max)
//!   per pass p (the max over ranks of micro batches; a rank out of batches runs an empty one):
//!     forward    every group of the plan gathered in order (next one prefetched), freed
//!                after use; the loss summed, divided by the step's global target count
//!     backward   groups gathered again in reverse, each full gradient reduce-scattered
//!                (sum) into this rank's shard and freed
//!   loss         all-reduce of the summed losses / global target count
//!   clip         local sum of squares of the gradient shards, all-reduced; shards scaled
//!   AdamW        on this rank's parameter, moment and gradient shards only
//! ```
//!
//! With the optimizer offload (`train.offload_optimizer`) the rank's `[shard]` master weights
//! and moments are in its exec's host pool from the start (made there, never on the device):
//! each gather first copies the host shard into the rank's staging buffer (`[shard]` of the
//! largest group on the device, the collective reads device memory; two such slots on an
//! NPU, where the next shard's copy runs ahead, `fsdp::schedule`), and AdamW streams
//! each trained group's p, m, v through the device (`model::optim::adamw_group`).
//!
//! Context parallelism ([`FsdpRank::with_cp`], world = dp x cp): the world's consecutive
//! groups of `cp` ranks are CP groups, each a data-parallel replica that takes the same micro
//! batches and splits their tokens ([`crate::cp`]). FSDP still shards over the whole world,
//! not over the replicas: every rank keeps 1/world of the parameters, gradients and optimizer
//! state (sharding over dp alone would keep cp times more per rank), and the CP ranks'
//! partial gradients of the same batch are summed by the same reduce-scatter that sums the
//! replicas'. The target count and the loss are summed over the world from each rank's
//! label shard, so every token counts once.
//!
//! One communicator carries every collective of the rank: on the CPU a collective blocks its
//! rank until all ranks join, so the rank's collectives are one sequence, the same on every
//! rank by construction (the step's scalars, then each pass's [`Schedule`]).

mod gather;
mod logits;

use super::reduce::Reducer;
use super::schedule::{GradShards, Schedule};
use super::shard::ShardLayout;
use super::source::{born_on_host, Reader, ShardSource};
use super::state::{GroupState, ShardState};
use super::FsdpError;
use crate::checkpoint::Kind;
use crate::cp::{CpGroup, CpSettings};
use crate::model::offload::Stored;
use crate::model::optim::{adamw_group, AdamWConfig};
use crate::model::source::PlanInputs;
use crate::model::source::{Resident, Streamer};
use crate::model::{
    Act, Batch, Exec, Grads, LossMode, MemoryFeatures, Mistral3Config, ParamLayout, Part, Pass,
    PassPlan, StepMemory,
};
use crate::train::TrainSettings;
use cannon_kernels::cross_entropy::{LossNorm, IGNORE_INDEX};
use cannon_kernels::{ops, Tensor};
use cannon_runtime::comm::{Communicator, ReduceOp};
use cannon_runtime::{BufferView, BufferViewMut, DeviceBuffer};

/// What a sharded step needs besides the batches and the learning rate.
#[derive(Clone, Debug, PartialEq)]
pub struct FsdpSettings {
    /// torch.optim.AdamW's hyper-parameters (`lr` is given per step).
    pub adamw: AdamWConfig,
    /// Global L2 norm the gradients are clipped to (`<= 0` or infinite only measures).
    pub max_grad_norm: f64,
    /// Parts that get neither gradients nor optimizer state.
    pub frozen: Vec<Part>,
    pub loss_mode: LossMode,
    /// Recompute and offload ([`MemoryFeatures`]).
    pub memory: MemoryFeatures,
}

impl FsdpSettings {
    /// The settings of an unsharded training run, full loss.
    pub fn from_train(t: &TrainSettings) -> Self {
        FsdpSettings {
            adamw: t.adamw,
            max_grad_norm: t.max_grad_norm,
            frozen: t.frozen.clone(),
            loss_mode: LossMode::Full,
            memory: MemoryFeatures::default(),
        }
    }
}

/// What one step did (the same on every rank except `for_peers` and `memory`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepStats {
    /// Optimizer steps taken so far, this one included.
    pub step: u64,
    /// Mean loss over the trained targets of every micro batch on every rank.
    pub loss: f64,
    /// Global gradient L2 norm before clipping.
    pub grad_norm: f64,
    /// Trained targets of the step (the loss divisor).
    pub targets: usize,
    /// Tokens of the step, every rank.
    pub tokens: usize,
    /// Micro-batch passes every rank ran.
    pub passes: usize,
    /// Gathers and reduce-scatters this rank issued only because its peers needed them
    /// (groups its own micro batches did not use).
    pub for_peers: usize,
    /// This rank's allocator over the step.
    pub memory: StepMemory,
}

/// One rank of an FSDP (ZeRO-3) run (see the module docs).
#[derive(Debug)]
pub struct FsdpRank {
    cfg: Mistral3Config,
    layout: ParamLayout,
    exec: Exec,
    comm: Communicator,
    cut: ShardLayout,
    /// `[shard]` f32 master weights of every group (in the host pool under the optimizer
    /// offload).
    params: Vec<Stored>,
    /// `[shard]` gradient, first and second moment of every trained group.
    grads: Grads,
    m: Vec<Option<Stored>>,
    v: Vec<Option<Stored>>,
    /// Under the optimizer offload: the device buffer a host shard is copied into for its
    /// all-gather (`[max shard]`); a world of one copies its groups in through `streamer`.
    staging: Option<Tensor<f32>>,
    streamer: Option<Streamer>,
    step: u64,
    settings: FsdpSettings,
    /// This rank's CP group (None: no context parallelism) and its replica index.
    cp: Option<CpGroup>,
    replica: usize,
}

impl FsdpRank {
    /// This rank of `comm`'s group, on `exec` (whose allocator holds the rank's memory),
    /// with its shard of every group read or drawn from `source` (one group at a time: the
    /// rank never holds more of the model than its shards, [`super::source`]). A checkpoint
    /// source also gives the AdamW moments and step. Local: no collective.
    pub fn new(
        comm: Communicator,
        exec: Exec,
        cfg: Mistral3Config,
        source: ShardSource<'_>,
        settings: FsdpSettings,
    ) -> Result<Self, FsdpError> {
        if comm.device() != exec.device() {
            return Err(FsdpError::Invalid(format!(
                "the communicator is on {}, the rank's stream on {}",
                comm.device(),
                exec.device()
            )));
        }
        // Offloading needs a host pool beside the rank's allocator.
        let exec = match (settings.memory.needs_host_pool(), exec.host_pool()) {
            (true, None) => exec.with_host_pool()?,
            _ => exec,
        };
        let layout = ParamLayout::new(&cfg);
        let (rank, world) = (comm.rank(), comm.world_size());
        let cut = ShardLayout::new(&layout, world);
        let trains = |g: usize| !settings.frozen.contains(&layout.groups[g].part);
        // Meta ranks hold sizes and no values: their source is read for sizes only.
        let meta = exec.device().is_meta();
        let mut reader = Reader::open(source, &layout, &trains, !meta)?;
        // Under the optimizer offload the shards and moments are made in the host pool.
        let pool = exec
            .host_pool()
            .filter(|_| settings.memory.offload_optimizer);
        let store = |values: &[f32]| -> Result<Stored, FsdpError> {
            Ok(match pool {
                Some(pool) => Stored::Host(Box::new(pool.from_values(values)?)),
                None => Stored::Device(exec.upload(values, &[values.len()])?),
            })
        };
        let groups = layout.groups.len();
        // A CPU rank keeps its shards in its allocator's host memory: each is read straight
        // into the tensor that keeps it, the zeros written beside the reads
        // (`source::born_on_host`). Elsewhere (an NPU, the host pool, a meta rank, which
        // measures what an NPU holds) a shard goes through a host copy that is then stored.
        let (params, m, v, grads) = if exec.device().is_cpu() && pool.is_none() {
            let b = born_on_host(&mut reader, &exec, &layout, &cut, rank, &trains)?;
            let device = |t: Vec<Option<Tensor<f32>>>| t.into_iter().map(|x| x.map(Stored::Device));
            let params = b.params.into_iter().map(Stored::Device).collect();
            (
                params,
                device(b.m).collect(),
                device(b.v).collect(),
                b.grads,
            )
        } else {
            let shard = |reader: &mut Reader<'_>, kind, g: usize| -> Result<Stored, FsdpError> {
                let c = cut.groups[g];
                if !reader.holds(kind) {
                    // Moments start at zero; a device makes its zeros itself.
                    return match pool {
                        Some(_) => store(&vec![0.0; c.shard]),
                        None => Ok(Stored::Device(exec.zeros(&[c.shard])?)),
                    };
                }
                let mut values = vec![0.0; c.shard];
                reader.shard_into(&layout, kind, g, c, rank, &mut values)?;
                store(&values)
            };
            let (mut params, mut m, mut v) = (Vec::new(), Vec::new(), Vec::new());
            for g in 0..groups {
                params.push(shard(&mut reader, Kind::Param, g)?);
                for (kind, dst) in [(Kind::ExpAvg, &mut m), (Kind::ExpAvgSq, &mut v)] {
                    dst.push(trains(g).then(|| shard(&mut reader, kind, g)).transpose()?);
                }
            }
            let grads = (0..groups)
                .map(|g| {
                    let z = trains(g).then(|| exec.zeros(&[cut.groups[g].shard]));
                    Ok(z.transpose()?)
                })
                .collect::<Result<Vec<_>, FsdpError>>()?;
            (params, m, v, grads)
        };
        let step = reader.adam_step();
        drop(reader);
        let grads = Grads { data: grads };
        // A world of one holds whole groups: a pass uses them where they are (a host-pool
        // group copied in, the next one ahead) and accumulates into the gradients in place,
        // as one process's model does: no gathered copy, no staging, no reduce-scatter.
        let local = world == 1;
        let streamer = (local && pool.is_some()).then(|| Streamer::new(exec.clone()));
        let staging = match pool {
            Some(_) if !local => {
                let largest = cut.largest_shard();
                let slots = cannon_runtime::HostPool::staging_slots(exec.device());
                Some(exec.zeros(&[slots * largest])?)
            }
            _ => None,
        };
        Ok(FsdpRank {
            cfg,
            layout,
            exec,
            comm,
            cut,
            params,
            grads,
            m,
            v,
            staging,
            streamer,
            step,
            settings,
            cp: None,
            replica: rank,
        })
    }

    /// Context parallelism over consecutive groups of `cp.size` ranks (see the module docs):
    /// checks the layout against the model's heads and splits the communicator. Collective:
    /// every rank calls it with the same settings. `cp.size = 1` changes nothing.
    pub fn with_cp(mut self, cp: CpSettings) -> Result<Self, FsdpError> {
        if cp.size <= 1 {
            return Ok(self);
        }
        cp.check(&self.cfg)?;
        let (group, replica) = CpGroup::split(&self.comm, cp, self.exec.stream())?;
        self.cp = Some(group);
        self.replica = replica;
        Ok(self)
    }

    /// This rank's CP group, if any.
    pub fn cp(&self) -> Option<&CpGroup> {
        self.cp.as_ref()
    }

    /// `(replica, replicas)`: which data-parallel share of the micro batches this rank takes
    /// (its CP group's), of how many (world / cp).
    pub fn data_parallel(&self) -> (usize, usize) {
        let cp = self.cp.as_ref().map_or(1, CpGroup::size);
        (self.replica, self.world_size() / cp)
    }

    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    pub fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    /// The rank's communicator, for collectives outside the step (a checkpoint's agreement
    /// that every rank wrote its file). Every rank must make the same calls in the same order.
    /// The rank's communicator, the rest dropped (its shards, gradients and moments freed):
    /// for a new rank on the same communicator, as a resume measured after a run makes one.
    pub fn into_comm(self) -> Communicator {
        self.comm
    }

    pub fn comm(&self) -> &Communicator {
        &self.comm
    }

    pub fn cfg(&self) -> &Mistral3Config {
        &self.cfg
    }

    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// How the groups are cut over the ranks.
    pub fn shard_layout(&self) -> &ShardLayout {
        &self.cut
    }

    pub fn exec(&self) -> &Exec {
        &self.exec
    }

    pub fn settings(&self) -> &FsdpSettings {
        &self.settings
    }

    /// AdamW steps taken.
    pub fn steps_taken(&self) -> u64 {
        self.step
    }

    /// This rank's `[shard]` master weights of every group and AdamW moments of the trained
    /// ones, where the rank keeps them (a checkpoint streams them one tensor at a time).
    pub fn shards(&self) -> (&[Stored], &[Option<Stored>], &[Option<Stored>]) {
        (&self.params, &self.m, &self.v)
    }

    /// Whether group `g` trains.
    pub fn trains(&self, g: usize) -> bool {
        self.grads.has(g)
    }

    /// One optimizer step over this rank's micro batches `micro` (the global batch is every
    /// rank's micro batches): forward and backward of each, gradient shards summed over
    /// micro batches and ranks, clipped by the global norm, AdamW at `lr` on the shards.
    /// Collective: every rank calls it, with its own batches (possibly none).
    pub fn step<A: Act>(&mut self, micro: &[Batch], lr: f64) -> Result<StepStats, FsdpError> {
        let alloc = self.exec.allocator().clone();
        alloc.reset_peak();
        let start_allocated = alloc.stats().allocated;
        let head = self.agree(micro)?;
        // No trained target anywhere (every rank knows): no pass, no update.
        let divisor = (head.targets > 0).then_some(head.targets);
        let passes = if divisor.is_some() {
            head.images.len()
        } else {
            0
        };
        let norm = LossNorm::Divisor(head.targets.max(1) as f64);
        if self.is_local() {
            // Accumulated in place over the passes (see `pass_local`).
            self.grads.zero(self.exec.stream())?;
        }
        let mut fresh = vec![!self.is_local(); self.layout.groups.len()];
        let (mut loss_sum, mut for_peers) = (0.0, 0);
        for (p, &images) in head.images.iter().enumerate().take(passes) {
            let (sum, peers) = self.pass::<A>(micro.get(p), images, norm, &mut fresh)?;
            loss_sum += sum;
            for_peers += peers;
        }
        let exec = self.exec.clone();
        let st = exec.stream();
        // A trained group no pass released (vision with no image anywhere) got no gradient.
        for (g, shard) in self.grads.data.iter_mut().enumerate() {
            if let (Some(shard), true) = (shard.as_mut(), fresh[g]) {
                shard.zero(st)?;
            }
        }
        let loss_total = self.all_reduce_scalar(loss_sum)?;
        let (loss, grad_norm) = match divisor {
            Some(n) => {
                let grad_norm = self.clip()?;
                self.update(lr)?;
                (loss_total / n as f64, grad_norm)
            }
            // Nothing trained anywhere in this step (every answer cut away): no update, so
            // AdamW's moments and step count do not move either (as the one-rank loop).
            None => (0.0, 0.0),
        };
        let s = alloc.stats();
        Ok(StepStats {
            step: self.step,
            loss,
            grad_norm,
            targets: head.targets,
            tokens: head.tokens,
            passes,
            for_peers,
            memory: StepMemory {
                start_allocated,
                max_allocated: s.peak_allocated,
                max_reserved: s.peak_reserved,
            },
        })
    }

    /// AdamW at `lr` on this rank's parameter shards of the trained groups.
    fn update(&mut self, lr: f64) -> Result<(), FsdpError> {
        let st = self.exec.stream();
        self.step += 1;
        let hp = AdamWConfig {
            lr,
            ..self.settings.adamw
        };
        let pool = self.exec.host_pool().map(|p| &**p);
        for (((p, g), m), v) in self
            .params
            .iter_mut()
            .zip(&self.grads.data)
            .zip(&mut self.m)
            .zip(&mut self.v)
        {
            if let (Some(g), Some(m), Some(v)) = (g, m.as_mut(), v.as_mut()) {
                adamw_group(st, pool, p, g, m, v, self.step, &hp)?;
            }
        }
        Ok(())
    }

    /// The step's global facts, agreed by every rank before any pass (so that a batch one
    /// rank rejects stops every rank with an error instead of leaving them waiting).
    fn agree(&self, micro: &[Batch]) -> Result<StepHead, FsdpError> {
        let st = self.exec.stream();
        let mut bad = None;
        let (mut targets, mut tokens) = (0i64, 0i64);
        for (i, b) in micro.iter().enumerate() {
            if let Err(e) = crate::model::check_batch(&self.cfg, b) {
                bad.get_or_insert((i, e));
            }
            let mut t = b.targets();
            // A CP rank counts its label shard (every token once over the group) and the
            // group's first rank its tokens.
            if let Some(cp) = &self.cp {
                match cp.layout(t.len(), &b.sequence_ends()) {
                    Ok(l) => t = l.shard(&t, IGNORE_INDEX),
                    Err(e) => {
                        bad.get_or_insert((i, e.into()));
                    }
                }
            }
            targets += t.iter().filter(|&&l| l != IGNORE_INDEX).count() as i64;
            if self.cp.as_ref().is_none_or(|c| c.rank == 0) {
                tokens += b.tokens() as i64;
            }
        }
        let sums = [
            targets,
            tokens,
            i64::from(bad.is_some()),
            micro.len() as i64,
        ];
        // Meta ranks go through the same collectives (checked, nothing moved) but read no
        // values back: each takes its own counts as every rank's (sums over the world,
        // maxima its own), which is what a layout of equal shares agrees on.
        let meta = self.exec.device().is_meta();
        let world = self.world_size() as i64;
        let mut buf = DeviceBuffer::clone_htod(st, &sums)?;
        let mut sums_view = buf.view_mut();
        self.comm
            .all_reduce_in_place(&mut sums_view, ReduceOp::Sum, st)?;
        let sums = match meta {
            true => vec![sums[0] * world, sums[1] * world, sums[2], sums[3] * world],
            false => buf.clone_dtoh(st)?,
        };
        if let Some((i, e)) = bad {
            return Err(FsdpError::Batch {
                rank: self.rank(),
                index: i,
                source: e,
            });
        }
        if sums[2] > 0 {
            return Err(FsdpError::PeerBatch {
                rank: self.rank(),
                ranks: sums[2] as usize,
            });
        }
        let mut passes = DeviceBuffer::clone_htod(st, &[micro.len() as i64])?;
        self.comm
            .all_reduce_in_place(&mut passes.view_mut(), ReduceOp::Max, st)?;
        let passes = match meta {
            true => micro.len(),
            false => passes.clone_dtoh(st)?[0] as usize,
        };
        let flags: Vec<i64> = (0..passes)
            .map(|p| i64::from(micro.get(p).is_some_and(|b| !b.images.is_empty())))
            .collect();
        let images = if passes == 0 {
            Vec::new()
        } else {
            let mut f = DeviceBuffer::clone_htod(st, &flags)?;
            self.comm
                .all_reduce_in_place(&mut f.view_mut(), ReduceOp::Max, st)?;
            let f = if meta { flags } else { f.clone_dtoh(st)? };
            f.iter().map(|&x| x > 0).collect()
        };
        Ok(StepHead {
            targets: sums[0] as usize,
            tokens: sums[1] as usize,
            images,
        })
    }

    /// Forward + backward of one micro batch (None: this rank has none left and only takes
    /// part in the collectives). Returns the summed loss and the collectives made for peers.
    fn pass<A: Act>(
        &mut self,
        batch: Option<&Batch>,
        images: bool,
        loss_norm: LossNorm,
        fresh: &mut [bool],
    ) -> Result<(f64, usize), FsdpError> {
        if self.is_local() {
            return match batch {
                Some(b) => self.pass_local::<A>(b, loss_norm).map(|sum| (sum, 0)),
                None => Ok((0.0, 0)),
            };
        }
        let grads = &self.grads;
        let trains = |g: usize| grads.has(g);
        let inputs = PlanInputs {
            trains: &trains,
            images,
            dpixels: false,
        };
        let plan = PassPlan::new(&self.cfg, &self.layout, inputs);
        let (exec, layout, cut) = (&self.exec, &self.layout, &self.cut);
        let (cfg, loss_mode) = (&self.cfg, self.settings.loss_mode);
        let memory = self.settings.memory;
        let (comm, shards) = (&self.comm, &self.params[..]);
        let staging = &mut self.staging;
        let cp = self.cp.as_ref();
        let steps = Schedule::forward_steps(&plan.forward);
        let fwd = Schedule::new(exec, comm, layout, cut, shards, steps, None)
            .with_staging(staging.as_mut());
        let acts = match batch {
            Some(b) => {
                let pass = Pass {
                    cfg,
                    exec,
                    loss_mode,
                    memory,
                    params: &fwd,
                    loss_norm,
                    logits: crate::model::Logits::Grad,
                    cp,
                };
                Some(pass.forward::<A>(b)?)
            }
            None => None,
        };
        let mut for_peers = fwd.finish()?;

        let grads = GradShards {
            shards: &mut self.grads.data,
            fresh,
        };
        let bwd = Schedule::new(exec, comm, layout, cut, shards, plan.backward, Some(grads))
            .with_staging(staging.as_mut());
        let mut sink = Reducer::new(exec, cut, &bwd);
        let mut sum = 0.0;
        if let (Some(b), Some(a)) = (batch, &acts) {
            let pass = Pass {
                cfg,
                exec,
                loss_mode,
                memory,
                params: &bwd,
                loss_norm,
                logits: crate::model::Logits::Grad,
                cp,
            };
            pass.backward(b, a, &mut sink, None)?;
            sum = a.head.sum;
        }
        drop(acts);
        sink.finish()?;
        for_peers += bwd.finish()?;
        Ok((sum, for_peers))
    }

    /// A world of one without context parallelism: the shards are the whole groups.
    fn is_local(&self) -> bool {
        self.cut.world == 1 && self.cp.is_none()
    }

    /// [`Self::pass`] in a world of one: the groups lent where they are, the gradients
    /// accumulated in place (zeroed at the step's start). Returns the summed loss.
    fn pass_local<A: Act>(&mut self, b: &Batch, loss_norm: LossNorm) -> Result<f64, FsdpError> {
        let params = Resident::new(&self.layout, &self.params, self.streamer.as_ref());
        let pass = Pass {
            cfg: &self.cfg,
            exec: &self.exec,
            loss_mode: self.settings.loss_mode,
            memory: self.settings.memory,
            params: &params,
            loss_norm,
            logits: crate::model::Logits::Grad,
            cp: None,
        };
        let acts = pass.forward::<A>(b)?;
        pass.backward(b, &acts, &mut self.grads, None)?;
        Ok(acts.head.sum)
    }

    /// Sum over the ranks of one f64. HCCL reduces no fp64 (its reductions take int8..int64,
    /// fp16, fp32 and bf16) but moves fp64, so the values are all-gathered and summed on the
    /// host in rank order: the same sum on every rank and every backend.
    fn all_reduce_scalar(&self, x: f64) -> Result<f64, FsdpError> {
        let st = self.exec.stream();
        let one = DeviceBuffer::clone_htod(st, &[x])?;
        let mut all = self.exec.empty::<f64>(&[self.comm.world_size()])?;
        self.comm.all_gather(&one.view(), &mut all.view_mut(), st)?;
        Ok(all.to_host(st)?.iter().sum())
    }

    /// torch's `clip_grad_norm_` on sharded gradients: the local sum of squares of the
    /// shards (padding is zero), summed over the ranks, gives the global norm; every rank
    /// scales its shards by the same coefficient. Returns the norm before clipping.
    fn clip(&mut self) -> Result<f64, FsdpError> {
        let st = self.exec.stream();
        let views: Vec<BufferView<'_, f32>> =
            self.grads.data.iter().flatten().map(Tensor::view).collect();
        let local = ops::grad_sum_squares(st, &views)?;
        drop(views);
        let total = self.all_reduce_scalar(local)?;
        let max_norm = self.settings.max_grad_norm;
        if max_norm > 0.0 && max_norm.is_finite() {
            let mut views: Vec<BufferViewMut<'_, f32>> = self
                .grads
                .data
                .iter_mut()
                .flatten()
                .map(Tensor::view_mut)
                .collect();
            Ok(ops::clip_with_sum_squares(st, &mut views, total, max_norm)?)
        } else {
            Ok(total.sqrt())
        }
    }

    /// Host copies of this rank's shards and optimizer state.
    pub fn state(&self) -> Result<ShardState, FsdpError> {
        let st = self.exec.stream();
        let host = |t: &Option<Stored>| t.as_ref().map(|t| t.to_host(st)).transpose();
        let groups = (0..self.params.len())
            .map(|g| {
                Ok(GroupState {
                    params: self.params[g].to_host(st)?,
                    m: host(&self.m[g])?,
                    v: host(&self.v[g])?,
                })
            })
            .collect::<Result<_, FsdpError>>()?;
        Ok(ShardState {
            rank: self.rank(),
            world: self.world_size(),
            step: self.step,
            groups,
        })
    }

    /// Restores a state saved by [`FsdpRank::state`] on the same rank of a world of the same
    /// size and model.
    pub fn load_state(&mut self, s: &ShardState) -> Result<(), FsdpError> {
        if (s.rank, s.world) != (self.rank(), self.world_size()) {
            return Err(FsdpError::Invalid(format!(
                "a state of rank {} of {} cannot be loaded on rank {} of {}",
                s.rank,
                s.world,
                self.rank(),
                self.world_size()
            )));
        }
        if s.groups.len() != self.params.len() {
            return Err(FsdpError::Invalid(format!(
                "the state has {} groups, the model {}",
                s.groups.len(),
                self.params.len()
            )));
        }
        let st = self.exec.stream();
        for (g, gs) in s.groups.iter().enumerate() {
            let shard = self.cut.groups[g].shard;
            let fits = |x: &[f32]| x.len() == shard;
            let moments = (&gs.m, &gs.v, &self.m[g]);
            let moments_ok = match moments {
                (Some(m), Some(v), Some(_)) => fits(m) && fits(v),
                (None, None, None) => true,
                _ => false,
            };
            if !fits(&gs.params) || !moments_ok {
                return Err(FsdpError::Invalid(format!(
                    "group {g} ({}): the state's shard does not match this rank's \
                     ({shard} values, {})",
                    self.layout.groups[g]
                        .slots
                        .first()
                        .map_or("", |s| s.name.as_str()),
                    if self.m[g].is_some() {
                        "trained: moments expected"
                    } else {
                        "frozen: no moments"
                    }
                )));
            }
        }
        for (g, gs) in s.groups.iter().enumerate() {
            self.params[g].write(st, &gs.params)?;
            if let (Some(m), Some(v)) = (&gs.m, &gs.v) {
                upload_into(st, &mut self.m[g], m)?;
                upload_into(st, &mut self.v[g], v)?;
            }
        }
        self.step = s.step;
        Ok(())
    }
}

fn upload_into(
    st: &cannon_runtime::Stream,
    dst: &mut Option<Stored>,
    src: &[f32],
) -> Result<(), FsdpError> {
    if let Some(t) = dst.as_mut() {
        t.write(st, src)?;
    }
    Ok(())
}

/// The facts of a step every rank agreed on.
struct StepHead {
    targets: usize,
    tokens: usize,
    /// Per pass: whether any rank's micro batch of that pass has images.
    images: Vec<bool>,
}
