//! Forward passes without a gradient under a rank's sharded weights: the logits of a batch
//! (the held-out evaluation's greedy answers) and its summed loss (the validation loss),
//! which the ranks run together, each on its own rows (so no process reads the model back
//! whole, and no rank repeats another's rows).

use super::FsdpRank;
use crate::model::source::{PlanInputs, Resident};
use crate::model::{ActElem, Batch, ForwardActs, GroupOrder, Logits, LossMode, ModelPass};
use crate::parallel::fsdp::schedule::Schedule;
use crate::parallel::fsdp::FsdpError;
use cannon_kernels::cross_entropy::LossNorm;
use cannon_kernels::{KernelError, Tensor};
use cannon_runtime::comm::ReduceOp;
use cannon_runtime::Stream;

impl FsdpRank {
    /// `read` of the `[rows·seq, vocab]` f32 logits of this rank's `batch` on its device (the
    /// evaluation reads their argmaxes in pieces, `eval::score::greedy_ids`; a whole host
    /// copy is `|t, st| t.to_host(st)`): a forward pass with the full logits kept, no
    /// backward, no gradient, the weights untouched.
    /// Collective: every rank calls it, each with its own rows (None: this rank has none and
    /// only takes part in the gathers); the ranks first agree on the batches (a bad batch on
    /// any rank stops every rank) and on whether any has images (the vision groups are then
    /// gathered by every rank). A rank holds its shards plus the gathered groups and its own
    /// rows' activations, as in a step's forward; context parallelism is not used. The memory
    /// features of the run's step apply.
    pub fn forward_logits<A: ActElem, R>(
        &mut self,
        batch: Option<&Batch>,
        read: impl FnOnce(&Tensor<f32>, &Stream) -> Result<R, KernelError>,
    ) -> Result<Option<R>, FsdpError> {
        let out = |acts: &ForwardActs<A>, st: &Stream| -> Result<R, FsdpError> {
            let t = acts.logits().ok_or_else(|| {
                FsdpError::Invalid("the forward kept no logits (full loss expected)".into())
            })?;
            Ok(read(t, st)?)
        };
        self.forward_only(batch, LossMode::Full, Logits::Kept, out)
    }

    /// The summed loss and the trained targets of this rank's `batch` (None: it has none and
    /// only takes part in the gathers): the validation loss's forward, with the run's loss
    /// mode (the chunked loss keeps no `[T,V]` logits), no backward, no gradient, the
    /// weights untouched. Collective as [`Self::forward_logits`]; the sums are this rank's
    /// (the caller adds them over the ranks).
    pub fn forward_loss<A: ActElem>(
        &mut self,
        batch: Option<&Batch>,
    ) -> Result<Option<(f64, usize)>, FsdpError> {
        let mode = self.settings.loss_mode;
        let out = |acts: &ForwardActs<A>, _: &Stream| Ok((acts.head.sum, acts.head.targets));
        // The full loss keeps its logits (nothing to write a gradient over); the chunked loss
        // keeps none whatever is asked.
        self.forward_only(batch, mode, Logits::Kept, out)
    }

    /// The forward of `batch` under the sharded weights with no gradient, `out` reading what
    /// the caller needs from its activations (see [`Self::forward_logits`]).
    fn forward_only<A: ActElem, R>(
        &mut self,
        batch: Option<&Batch>,
        loss_mode: LossMode,
        logits: Logits,
        out: impl FnOnce(&ForwardActs<A>, &Stream) -> Result<R, FsdpError>,
    ) -> Result<Option<R>, FsdpError> {
        let exec = &self.exec;
        let (cfg, memory) = (&self.cfg, self.settings.memory);
        let pass = |params| ModelPass {
            cfg,
            exec,
            loss_mode,
            memory,
            params,
            // The loss divided by 1: its sum is what the callers read.
            loss_norm: LossNorm::Divisor(1.0),
            logits,
            cp: None,
        };
        if self.cut.world == 1 {
            let Some(batch) = batch else {
                return Ok(None);
            };
            crate::model::check_batch(cfg, batch).map_err(|e| FsdpError::Batch {
                rank: self.rank(),
                index: 0,
                source: e,
            })?;
            let params = Resident::new(&self.layout, &self.params, self.streamer.as_ref());
            let acts = pass(&params).forward::<A>(batch)?;
            return out(&acts, exec.stream()).map(Some);
        }
        let micro: &[Batch] = batch.map_or(&[], std::slice::from_ref);
        let head = self.agree(micro)?;
        // No rank has rows: nothing to gather (every rank knows).
        let Some(&images) = head.images.first() else {
            return Ok(None);
        };
        let none = |_: usize| false;
        let inputs = PlanInputs {
            trains: &none,
            images,
            dpixels: false,
        };
        let plan = GroupOrder::new(&self.cfg, &self.layout, inputs);
        let steps = Schedule::forward_steps(&plan.forward);
        let (comm, shards) = (&self.comm, &self.params[..]);
        let fwd = Schedule::new(exec, comm, &self.layout, &self.cut, shards, steps, None)
            .with_staging(self.staging.as_mut());
        let found = match batch {
            Some(b) => {
                let acts = pass(&fwd).forward::<A>(b)?;
                Some(out(&acts, exec.stream())?)
            }
            None => None,
        };
        fwd.finish()?;
        Ok(found)
    }

    /// Sums `values` over the ranks, in place (every rank calls it with as many values).
    /// A meta rank's collective moves nothing: its values stay its own.
    pub fn all_reduce_sum_i64(&self, values: &mut [i64]) -> Result<(), FsdpError> {
        self.all_reduce_i64(values, ReduceOp::Sum)
    }

    /// The largest of each of `values` over the ranks, in place (as
    /// [`Self::all_reduce_sum_i64`]).
    pub fn all_reduce_max_i64(&self, values: &mut [i64]) -> Result<(), FsdpError> {
        self.all_reduce_i64(values, ReduceOp::Max)
    }

    fn all_reduce_i64(&self, values: &mut [i64], op: ReduceOp) -> Result<(), FsdpError> {
        if self.cut.world == 1 || values.is_empty() {
            return Ok(());
        }
        let st = self.exec.stream();
        let mut buf = cannon_runtime::DeviceBuffer::clone_htod(st, values)?;
        self.comm.all_reduce_in_place(&mut buf.view_mut(), op, st)?;
        if !self.exec.device().is_meta() {
            values.copy_from_slice(&buf.clone_dtoh(st)?);
        }
        Ok(())
    }
}
