//! The logits of a batch under a rank's sharded weights: the forward pass of the held-out
//! evaluation, which the ranks run together at the end of a run (so no process reads the
//! final model back whole).

use super::FsdpRank;
use crate::fsdp::schedule::Schedule;
use crate::fsdp::FsdpError;
use crate::model::source::{PlanInputs, Resident};
use crate::model::{Act, Batch, LossMode, Pass, PassPlan};
use cannon_kernels::cross_entropy::LossNorm;

impl FsdpRank {
    /// The `[rows·seq, vocab]` f32 logits of `batch` on the host: a forward pass with the
    /// full logits kept, no backward, no gradient, the weights untouched. Collective: every
    /// rank calls it with the same batch (every rank computes the whole batch, so each holds
    /// its shards plus the gathered groups and one forward's activations, as in a step;
    /// context parallelism is not used). The memory features of the run's step apply.
    pub fn forward_logits<A: Act>(&mut self, batch: &Batch) -> Result<Vec<f32>, FsdpError> {
        crate::model::check_batch(&self.cfg, batch).map_err(|e| FsdpError::Batch {
            rank: self.rank(),
            index: 0,
            source: e,
        })?;
        let exec = &self.exec;
        let (cfg, memory) = (&self.cfg, self.settings.memory);
        let pass = |params| eval_pass(cfg, exec, memory, params);
        let logits = |acts: &crate::model::ForwardActs<A>| -> Result<Vec<f32>, FsdpError> {
            let t = acts.logits().ok_or_else(|| {
                FsdpError::Invalid("the forward kept no logits (full loss expected)".into())
            })?;
            Ok(t.to_host(exec.stream())?)
        };
        if self.cut.world == 1 {
            let params = Resident::new(&self.layout, &self.params, self.streamer.as_ref());
            let acts = pass(&params).forward::<A>(batch)?;
            return logits(&acts);
        }
        let none = |_: usize| false;
        let inputs = PlanInputs {
            trains: &none,
            images: !batch.images.is_empty(),
            dpixels: false,
        };
        let plan = PassPlan::new(&self.cfg, &self.layout, inputs);
        let steps = Schedule::forward_steps(&plan.forward);
        let (comm, shards) = (&self.comm, &self.params[..]);
        let fwd = Schedule::new(exec, comm, &self.layout, &self.cut, shards, steps, None)
            .with_staging(self.staging.as_mut());
        let acts = pass(&fwd).forward::<A>(batch)?;
        let out = logits(&acts)?;
        drop(acts);
        fwd.finish()?;
        Ok(out)
    }
}

/// A forward pass with the full logits kept (the loss, divided by 1, is not used).
fn eval_pass<'a>(
    cfg: &'a crate::model::Mistral3Config,
    exec: &'a crate::model::Exec,
    memory: crate::model::MemoryFeatures,
    params: &'a dyn crate::model::ParamSource,
) -> Pass<'a> {
    Pass {
        cfg,
        exec,
        loss_mode: LossMode::Full,
        memory,
        params,
        loss_norm: LossNorm::Divisor(1.0),
        keep_logits: true,
    }
}
