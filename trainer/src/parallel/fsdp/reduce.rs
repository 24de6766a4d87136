//! The sharded [`GradSink`]: a group's full gradient exists only while the pass computes it;
//! when the pass releases the group, the [`Schedule`] reduce-scatters it (summed over the
//! ranks) into this rank's gradient shard, in the pass's order, and it is freed.

use super::schedule::Schedule;
use super::shard::ShardLayout;
use crate::model::{DeviceCtx, GradSink, ModelError};
use cannon_kernels::Tensor;
use cannon_runtime::BufferViewMut;

/// One pass's reduce-scattering sink.
pub struct Reducer<'s, 'a> {
    exec: &'a DeviceCtx,
    cut: &'a ShardLayout,
    sched: &'s Schedule<'a>,
    /// Full `[padded]` gradients the pass is computing.
    full: Vec<Option<Tensor<f32>>>,
    released: Vec<bool>,
}

impl<'s, 'a> Reducer<'s, 'a> {
    pub fn new(exec: &'a DeviceCtx, cut: &'a ShardLayout, sched: &'s Schedule<'a>) -> Self {
        let n = cut.groups.len();
        Reducer {
            exec,
            cut,
            sched,
            full: (0..n).map(|_| None).collect(),
            released: vec![false; n],
        }
    }

    /// Checks that no gradient the pass computed was left unreleased (it would be lost).
    pub fn finish(self) -> Result<(), ModelError> {
        match self.full.iter().position(Option::is_some) {
            Some(g) => Err(ModelError::Plan(format!(
                "group {g}'s gradient was computed but never released"
            ))),
            None => Ok(()),
        }
    }
}

impl GradSink for Reducer<'_, '_> {
    fn trains(&self, g: usize) -> bool {
        self.sched.trains(g)
    }

    fn grad(&mut self, g: usize) -> Result<Option<BufferViewMut<'_, f32>>, ModelError> {
        if !self.trains(g) {
            return Ok(None);
        }
        if self.released[g] {
            return Err(ModelError::Plan(format!(
                "group {g}'s gradient asked for after it was released"
            )));
        }
        let cut = self.cut.groups[g];
        if self.full[g].is_none() {
            self.full[g] = Some(self.exec.zeros(&[cut.padded(self.cut.world)])?);
        }
        match self.full[g].as_mut() {
            Some(t) => Ok(Some(t.buffer_mut().slice_mut(0..cut.len)?)),
            None => Ok(None),
        }
    }

    fn release(&mut self, g: usize) -> Result<(), ModelError> {
        if !self.trains(g) {
            return Ok(());
        }
        let full = match self.full[g].take() {
            Some(f) => f,
            None => {
                let cut = self.cut.groups[g];
                self.exec.zeros(&[cut.padded(self.cut.world)])?
            }
        };
        self.sched.release(g, &full)?;
        self.released[g] = true;
        Ok(())
    }
}
