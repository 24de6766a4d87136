//! The collectives of one pass, in the order of the pass's plan, and the sharded
//! [`ParamSource`].
//!
//! On the CPU a collective blocks its rank until every rank has joined it, so all of a rank's
//! collectives form one sequence that must be the same on every rank (HCCL needs the same).
//! A pass's plan (`GroupOrder`) is a list of steps, one per group; each step runs
//!
//! ```text
//! enter   gather the group (unless its gather was prefetched), then issue the gather of the
//!         next fetching step (the prefetch: on an asynchronous backend it overlaps compute)
//! ...     the model computes with the group (and its gradient) and drops the weights
//! leave   reduce-scatter the group's gradient (steps of trained groups)
//! ```
//!
//! and every rank runs every step of the plan in order, whether or not its own micro batch
//! uses the group: a rank whose batch has no images skips the vision tower, so when its pass
//! enters a later step (or finishes) the schedule runs the skipped steps for the peers:
//! gathering and dropping, and reduce-scattering zeros, whose result (the peers' sum for this
//! rank's shard) still lands in the gradient shard. The sequence of collectives is then a
//! function of the plan alone.
//!
//! The gradient shards accumulate over the micro batches of a step: a step's first
//! reduce-scatter into a shard writes it, later ones are added. Entering a group that is not
//! ahead in the plan, or leaving a step whose gradient was never released, is an error, never
//! a silent extra collective or a lost gradient.
//!
//! A shard in the host pool (the optimizer offload) is copied into the rank's staging buffer
//! on the device before its all-gather ([`Schedule::with_staging`]). On an NPU the copies
//! run on the pool's copy stream, one step ahead: the buffer holds two slots, and right after
//! a gather from one slot is queued the next fetching step's shard is copied into the other,
//! so that copy overlaps the compute queued before that step's gather (the compute stream
//! waits for it only there). A copy always waits for the work queued on the compute stream
//! before it (`HostPool::reload_into`), so a slot is never overwritten before the gather that
//! reads it. On the CPU, with one slot, each copy is made at its gather.

use super::shard::ShardLayout;
use crate::model::offload::Stored;
use crate::model::source::BackwardStep;
use crate::model::{DeviceCtx, GroupWeights, ModelError, ParamLayout, ParamSource};
use cannon_kernels::{ops, Tensor};
use cannon_runtime::comm::{Communicator, ReduceOp};
use cannon_runtime::CopyMark;
use std::cell::RefCell;

/// One pass's collectives (see the module docs); the pass's parameter source.
pub struct Schedule<'a> {
    exec: &'a DeviceCtx,
    comm: &'a Communicator,
    layout: &'a ParamLayout,
    cut: &'a ShardLayout,
    /// The largest group's shard: a staging slot's length.
    largest: usize,
    /// This rank's `[shard]` of every group.
    shards: &'a [Stored],
    state: RefCell<State<'a>>,
}

/// This rank's gradient shards, where a pass's reduce-scatters land.
pub struct GradShards<'a> {
    /// `[shard]` gradient of every trained group (None: frozen).
    pub shards: &'a mut [Option<Tensor<f32>>],
    /// Whether a group's shard has had no reduce-scatter yet this step (the next one writes
    /// it instead of adding to it).
    pub fresh: &'a mut [bool],
}

#[derive(Default)]
struct State<'a> {
    /// None for a pass that releases nothing (the forward).
    grads: Option<GradShards<'a>>,
    steps: Vec<BackwardStep>,
    /// The next step to enter.
    next: usize,
    /// The entered step whose gradient is still to be reduce-scattered.
    pending: Option<usize>,
    /// A gather issued ahead of its step: (step index, full buffer).
    prefetched: Option<(usize, Tensor<f32>)>,
    /// Collectives made only for the peers (steps this rank's pass skipped).
    for_peers: usize,
    /// Where a shard in the host pool is copied before its gather: `slots` of `[max shard]`.
    staging: Option<&'a mut Tensor<f32>>,
    /// A step whose host shard was copied ahead: (step index, slot, the copy's mark).
    ahead: Option<(usize, usize, CopyMark)>,
}

impl<'a> Schedule<'a> {
    /// A schedule of `steps` gathering from `shards`, reduce-scattering into `grads` (None:
    /// a pass that releases nothing, the forward).
    pub fn new(
        exec: &'a DeviceCtx,
        comm: &'a Communicator,
        layout: &'a ParamLayout,
        cut: &'a ShardLayout,
        shards: &'a [Stored],
        steps: Vec<BackwardStep>,
        grads: Option<GradShards<'a>>,
    ) -> Self {
        Schedule {
            exec,
            comm,
            layout,
            cut,
            largest: cut.largest_shard(),
            shards,
            state: RefCell::new(State {
                steps,
                grads,
                ..State::default()
            }),
        }
    }

    /// The device buffer host shards are copied into before their gather (needed when any
    /// shard is in the host pool).
    pub fn with_staging(self, staging: Option<&'a mut Tensor<f32>>) -> Self {
        self.state.borrow_mut().staging = staging;
        self
    }

    /// Whether group `g` has a gradient shard.
    pub fn trains(&self, g: usize) -> bool {
        let s = self.state.borrow();
        s.grads
            .as_ref()
            .is_some_and(|gr| gr.shards.get(g).is_some_and(Option::is_some))
    }

    /// The forward's steps: fetch each group of `order`, release none.
    pub fn forward_steps(order: &[usize]) -> Vec<BackwardStep> {
        order
            .iter()
            .map(|&group| BackwardStep {
                group,
                fetch: true,
                release: false,
            })
            .collect()
    }

    /// All-gathers the group of step `i` into a new padded full buffer `[shard * world]` (a
    /// shard in the host pool through a staging slot, see the module docs).
    fn gather(&self, s: &mut State, i: usize) -> Result<Tensor<f32>, ModelError> {
        let st = self.exec.stream();
        let g = s.steps[i].group;
        let cut = self.cut.groups[g];
        let mut full = self.exec.empty::<f32>(&[cut.padded(self.cut.world)])?;
        if let Stored::Device(t) = &self.shards[g] {
            self.comm.all_gather(&t.view(), &mut full.view_mut(), st)?;
            return Ok(full);
        }
        let (slot, mark) = match s.ahead.take() {
            Some((a, slot, mark)) if a == i => (slot, mark),
            // No copy ahead (the first host shard of the pass), or one for another step
            // (harmless: a later copy into its slot is ordered after it on the copy stream).
            _ => {
                let slot = 0;
                (slot, self.copy_shard(s, g, slot)?)
            }
        };
        self.pool()?.wait(st, &mark)?;
        let src = self
            .staging(s)?
            .buffer()
            .slice(self.slot(slot, cut.shard))?;
        self.comm.all_gather(&src, &mut full.view_mut(), st)?;
        let slots = self.slots(s);
        if slots > 1 {
            let next = (i + 1..s.steps.len()).find(|&n| {
                s.steps[n].fetch && matches!(self.shards[s.steps[n].group], Stored::Host(_))
            });
            if let Some(n) = next {
                let other = (slot + 1) % slots;
                let mark = self.copy_shard(s, s.steps[n].group, other)?;
                s.ahead = Some((n, other, mark));
            }
        }
        Ok(full)
    }

    fn pool(&self) -> Result<&cannon_runtime::HostPool, ModelError> {
        self.exec.host_pool().map(|p| &**p).ok_or_else(|| {
            ModelError::Plan(
                "a shard is in the host pool, but the schedule's exec has no host pool".into(),
            )
        })
    }

    /// How many `[max shard]` slots the staging buffer holds.
    fn slots(&self, s: &State) -> usize {
        match &s.staging {
            Some(t) if self.largest > 0 => t.numel() / self.largest,
            _ => 0,
        }
    }

    /// The first `len` values of staging slot `slot`.
    fn slot(&self, slot: usize, len: usize) -> std::ops::Range<usize> {
        slot * self.largest..slot * self.largest + len
    }

    fn staging<'s>(&self, s: &'s mut State<'_>) -> Result<&'s mut Tensor<f32>, ModelError> {
        s.staging.as_deref_mut().ok_or_else(|| {
            ModelError::Plan(
                "a shard is in the host pool, but the schedule has no staging buffer to gather \
                 it through"
                    .into(),
            )
        })
    }

    /// Queues the copy of group `g`'s host shard into staging slot `slot`; returns its mark.
    fn copy_shard(&self, s: &mut State, g: usize, slot: usize) -> Result<CopyMark, ModelError> {
        let Stored::Host(h) = &self.shards[g] else {
            return Err(ModelError::Plan(format!(
                "group {g}'s shard is not in the host pool"
            )));
        };
        let pool = self.pool()?;
        let range = self.slot(slot, self.cut.groups[g].shard);
        let mut dst = self.staging(s)?.buffer_mut().slice_mut(range)?;
        pool.reload_into(self.exec.stream(), h, &mut dst)?;
        Ok(pool.mark()?)
    }

    /// Reduce-scatters (sum over the ranks) the padded full gradient `full` of group `g` into
    /// this rank's shard: written by the step's first one, added by later ones.
    fn reduce_scatter(
        &self,
        s: &mut State,
        g: usize,
        full: &Tensor<f32>,
    ) -> Result<(), ModelError> {
        let st = self.exec.stream();
        let cut = self.cut.groups[g];
        let grads = s.grads.as_mut().ok_or_else(|| {
            ModelError::Plan(format!(
                "group {g}'s gradient released in a pass without gradients"
            ))
        })?;
        let (Some(Some(shard)), Some(fresh)) = (grads.shards.get_mut(g), grads.fresh.get_mut(g))
        else {
            return Err(ModelError::Plan(format!(
                "group {g}'s gradient released, but it does not train"
            )));
        };
        if *fresh {
            let mut dst = shard.view_mut();
            self.comm
                .reduce_scatter(&full.view(), &mut dst, ReduceOp::Sum, st)?;
            *fresh = false;
        } else {
            let mut part = self.exec.empty::<f32>(&[cut.shard])?;
            self.comm
                .reduce_scatter(&full.view(), &mut part.view_mut(), ReduceOp::Sum, st)?;
            ops::add_into(st, &mut shard.view_mut(), &part.view())?;
        }
        Ok(())
    }

    /// Runs the enter half of step `i`: its gather (or the prefetched one) and the prefetch
    /// of the next fetching step. Returns the step's weights if it fetches.
    fn enter_step(&self, s: &mut State, i: usize) -> Result<Option<Tensor<f32>>, ModelError> {
        let step = s.steps[i];
        s.next = i + 1;
        if !step.fetch {
            return Ok(None);
        }
        let buf = match s.prefetched.take() {
            Some((p, buf)) if p == i => buf,
            other => {
                s.prefetched = other;
                self.gather(s, i)?
            }
        };
        if let Some(n) = (i + 1..s.steps.len()).find(|&n| s.steps[n].fetch) {
            if s.prefetched.is_none() {
                let ahead = self.gather(s, n)?;
                s.prefetched = Some((n, ahead));
            }
        }
        Ok(Some(buf))
    }

    /// Runs step `i` with nothing computed, for the peers: gather and drop, reduce-scatter
    /// zeros.
    fn skip_step(&self, s: &mut State, i: usize) -> Result<(), ModelError> {
        let step = s.steps[i];
        if self.enter_step(s, i)?.is_some() {
            s.for_peers += 1;
        }
        if step.release {
            let cut = self.cut.groups[step.group];
            let zeros = self.exec.zeros(&[cut.padded(self.cut.world)])?;
            self.reduce_scatter(s, step.group, &zeros)?;
            s.for_peers += 1;
        }
        Ok(())
    }

    /// Enters the step of group `g`: the steps before it that the pass skipped run for the
    /// peers first. Returns the step's index and its weights if it fetches.
    fn enter(&self, s: &mut State, g: usize) -> Result<(usize, Option<Tensor<f32>>), ModelError> {
        if let Some(p) = s.pending {
            return Err(ModelError::Plan(format!(
                "group {g} entered before group {}'s gradient was released",
                s.steps[p].group
            )));
        }
        let i = (s.next..s.steps.len())
            .find(|&i| s.steps[i].group == g)
            .ok_or_else(|| {
                let rest: Vec<usize> = s.steps[s.next..].iter().map(|x| x.group).collect();
                ModelError::Plan(format!(
                    "group {g} used, but the rest of the pass plan is {rest:?}"
                ))
            })?;
        while s.next < i {
            let skipped = s.next;
            self.skip_step(s, skipped)?;
        }
        let buf = self.enter_step(s, i)?;
        if s.steps[i].release {
            s.pending = Some(i);
        }
        Ok((i, buf))
    }

    /// The pass releases group `g`'s gradient (`full`, padded): it is reduce-scattered into
    /// the shard. Enters `g`'s step first if the pass did not fetch it (a step that only
    /// releases, such as the embedding's).
    pub fn release(&self, g: usize, full: &Tensor<f32>) -> Result<(), ModelError> {
        let mut s = self.state.borrow_mut();
        let entered = s.pending.filter(|&p| s.steps[p].group == g);
        if entered.is_none() {
            self.enter(&mut s, g)?;
        }
        self.reduce_scatter(&mut s, g, full)?;
        s.pending = None;
        Ok(())
    }

    /// Runs the steps the pass did not reach, for the peers, so that every rank ends the pass
    /// having issued the same collectives. Returns how many of the pass's collectives were
    /// for the peers only.
    pub fn finish(self) -> Result<usize, ModelError> {
        let mut s = self.state.borrow_mut();
        if let Some(p) = s.pending {
            return Err(ModelError::Plan(format!(
                "the pass ended before group {}'s gradient was released",
                s.steps[p].group
            )));
        }
        while s.next < s.steps.len() {
            let i = s.next;
            self.skip_step(&mut s, i)?;
        }
        Ok(s.for_peers)
    }
}

impl ParamSource for Schedule<'_> {
    fn layout(&self) -> &ParamLayout {
        self.layout
    }

    fn fetch(&self, g: usize) -> Result<GroupWeights<'_>, ModelError> {
        let mut s = self.state.borrow_mut();
        let (i, buf) = self.enter(&mut s, g)?;
        let buf = buf.ok_or_else(|| {
            ModelError::Plan(format!(
                "group {g}'s weights fetched at step {i}, which only releases"
            ))
        })?;
        Ok(GroupWeights::Gathered {
            buf,
            len: self.cut.groups[g].len,
        })
    }
}
