//! One optimizer step of a rank (collective: every rank runs the same sequence):
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

use super::{FsdpRank, StepStats};
use crate::model::optim::{adamw_group, AdamWConfig};
use crate::model::source::{PlanInputs, Resident};
use crate::model::{ActElem, Batch, GroupOrder, ModelPass, StepMemory};
use crate::parallel::fsdp::reduce::Reducer;
use crate::parallel::fsdp::schedule::{GradShards, Schedule};
use crate::parallel::fsdp::FsdpError;
use cannon_kernels::cross_entropy::{LossNorm, IGNORE_INDEX};
use cannon_kernels::{ops, Tensor};
use cannon_runtime::comm::ReduceOp;
use cannon_runtime::{BufferView, BufferViewMut, DeviceBuffer};

impl FsdpRank {
    /// One optimizer step over this rank's micro batches `micro` (the global batch is every
    /// rank's micro batches): forward and backward of each, gradient shards summed over
    /// micro batches and ranks, clipped by the global norm, AdamW at `lr` on the shards.
    /// Collective: every rank calls it, with its own batches (possibly none).
    pub fn step<A: ActElem>(&mut self, micro: &[Batch], lr: f64) -> Result<StepStats, FsdpError> {
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
        if std::mem::take(&mut self.inject_inf) {
            if let Some(shard) = self.grads.data.iter_mut().flatten().next() {
                shard
                    .view_mut()
                    .slice_mut(0..1)?
                    .memcpy_htod(st, &[f32::INFINITY])?;
            }
        }
        let loss_total = self.all_reduce_scalar(loss_sum)?;
        let (loss, grad_norm, skipped) = match divisor {
            Some(n) => {
                let sum_squares = self.grad_sum_squares()?;
                let loss = loss_total / n as f64;
                // An inf or NaN anywhere reaches both sums, which every rank holds alike: no
                // rank applies a step another skips (Megatron's and DeepSpeed's skip).
                if loss.is_finite() && sum_squares.is_finite() {
                    let grad_norm = self.clip(sum_squares)?;
                    self.update(lr)?;
                    (loss, grad_norm, false)
                } else {
                    (loss, sum_squares.sqrt(), true)
                }
            }
            // Nothing trained anywhere in this step (every answer cut away): no update, so
            // AdamW's moments and step count do not move either (as the one-rank loop).
            None => (0.0, 0.0, false),
        };
        let s = alloc.stats();
        Ok(StepStats {
            step: self.step,
            loss,
            grad_norm,
            skipped,
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
        let _span = cannon_runtime::trace::span("adamw", cannon_runtime::trace::Cat::Optimizer);
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
    pub(super) fn agree(&self, micro: &[Batch]) -> Result<StepHead, FsdpError> {
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
    fn pass<A: ActElem>(
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
        let plan = GroupOrder::new(&self.cfg, &self.layout, inputs);
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
                let pass = ModelPass {
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
            let pass = ModelPass {
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
    fn pass_local<A: ActElem>(&mut self, b: &Batch, loss_norm: LossNorm) -> Result<f64, FsdpError> {
        let params = Resident::new(&self.layout, &self.params, self.streamer.as_ref());
        let pass = ModelPass {
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
    pub(crate) fn all_reduce_scalar(&self, x: f64) -> Result<f64, FsdpError> {
        let st = self.exec.stream();
        let one = DeviceBuffer::clone_htod(st, &[x])?;
        let mut all = self.exec.empty::<f64>(&[self.comm.world_size()])?;
        self.comm.all_gather(&one.view(), &mut all.view_mut(), st)?;
        Ok(all.to_host(st)?.iter().sum())
    }

    /// The global sum of squares of the gradient: the local one of the shards (padding is
    /// zero), summed over the ranks (the same value on every rank).
    fn grad_sum_squares(&self) -> Result<f64, FsdpError> {
        let st = self.exec.stream();
        let views: Vec<BufferView<'_, f32>> =
            self.grads.data.iter().flatten().map(Tensor::view).collect();
        let local = ops::grad_sum_squares(st, &views)?;
        drop(views);
        self.all_reduce_scalar(local)
    }

    /// torch's `clip_grad_norm_` on sharded gradients whose global sum of squares is
    /// `total`: every rank scales its shards by the same coefficient. Returns the norm before
    /// clipping.
    fn clip(&mut self, total: f64) -> Result<f64, FsdpError> {
        let st = self.exec.stream();
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
}

/// The facts of a step every rank agreed on.
pub(super) struct StepHead {
    pub(super) targets: usize,
    pub(super) tokens: usize,
    /// Per pass: whether any rank's micro batch of that pass has images.
    pub(super) images: Vec<bool>,
}
