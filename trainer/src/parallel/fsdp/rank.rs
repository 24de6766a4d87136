//! One rank of a sharded data-parallel run: its shards, its optimizer state and its step
//! ([`FsdpRank::step`], written out in the `step` submodule).
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
//! batches and splits their tokens ([`crate::parallel::cp`]). FSDP still shards over the whole world,
//! not over the replicas: every rank keeps 1/world of the parameters, gradients and optimizer
//! state (sharding over dp alone would keep cp times more per rank), and the CP ranks'
//! partial gradients of the same batch are summed by the same reduce-scatter that sums the
//! replicas'. The target count and the loss are summed over the world from each rank's
//! label shard, so every token counts once.
//!
//! One communicator carries every collective of the rank: on the CPU a collective blocks its
//! rank until all ranks join, so the rank's collectives are one sequence, the same on every
//! rank by construction (the step's scalars, then each pass's [`super::schedule::Schedule`]).

mod gather;
mod logits;
mod step;

use super::saved::Kind;
use super::settings::TrainSettings;
use super::shard::ShardLayout;
use super::source::{born_on_host, Reader, ShardSource};
use super::state::{GroupState, ShardState};
use super::FsdpError;
use crate::model::offload::Stored;
use crate::model::optim::AdamWConfig;
use crate::model::source::Streamer;
use crate::model::{
    DeviceCtx, Grads, LossMode, MemoryFeatures, Mistral3Config, ParamLayout, Part, StepMemory,
};
use crate::parallel::cp::{CpGroup, CpSettings};
use cannon_kernels::Tensor;
use cannon_runtime::comm::Communicator;

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
    /// The loss or the gradient norm was not finite: the step was not applied (weights,
    /// moments and the AdamW step count as before it; every rank decides alike, from the
    /// same all-gathered sums).
    pub skipped: bool,
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
    exec: DeviceCtx,
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
    /// Fault injection for the tests: the next step writes an inf into this rank's gradient.
    inject_inf: bool,
    /// This rank's CP group (None: no context parallelism) and its replica index.
    cp: Option<CpGroup>,
    replica: usize,
}

impl FsdpRank {
    /// This rank of `comm`'s group, on `exec` (whose allocator holds the rank's memory),
    /// with its shard of every group read or drawn from `source` (one group at a time: the
    /// rank never holds more of the model than its shards, `super::source`). A checkpoint
    /// source also gives the AdamW moments and step. Local: no collective.
    pub fn new(
        comm: Communicator,
        exec: DeviceCtx,
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
            inject_inf: false,
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
        cp.check(
            self.cfg.text_config.num_attention_heads,
            self.cfg.text_config.num_key_value_heads,
        )?;
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

    pub fn exec(&self) -> &DeviceCtx {
        &self.exec
    }

    pub fn settings(&self) -> &FsdpSettings {
        &self.settings
    }

    /// Makes this rank's next step find an inf in its gradient (written into its first
    /// trained shard after the backward pass): how the tests check that a step with a
    /// non-finite gradient is skipped, alike on every rank. Not used by the trainer.
    #[doc(hidden)]
    pub fn inject_inf_gradient(&mut self) {
        self.inject_inf = true;
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
