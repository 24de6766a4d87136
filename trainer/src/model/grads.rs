//! The gradients of a pass, one flat f32 group per trained layer group like the parameters
//! ([`super::params`]), and a group's gradient windowed one tensor at a time as a backward
//! step accumulates into it.

use super::error::ModelError;
use super::params::{ParamLayout, Part};
use cannon_kernels::device_ctx::DeviceCtx;
use cannon_kernels::{KernelError, Tensor};
use cannon_runtime::{BufferView, BufferViewMut, Stream};
use std::ops::Range;

/// Gradient tensors shaped like [`super::Params`], allocated only for the groups that train: a
/// frozen group has no tensor, so no backward step can write (or compute) its gradient.
#[derive(Debug)]
pub struct Grads {
    pub data: Vec<Option<Tensor<f32>>>,
}

/// The tensors of the groups that train.
impl<'a> IntoIterator for &'a mut Grads {
    type Item = &'a mut Tensor<f32>;
    type IntoIter = std::iter::Flatten<std::slice::IterMut<'a, Option<Tensor<f32>>>>;
    fn into_iter(self) -> Self::IntoIter {
        self.data.iter_mut().flatten()
    }
}

impl Grads {
    /// Zeroed tensors for the groups whose part is in `trainable`.
    pub fn new(
        exec: &DeviceCtx,
        layout: &ParamLayout,
        trainable: &[Part],
    ) -> Result<Self, ModelError> {
        let data = layout
            .groups
            .iter()
            .map(|g| {
                trainable
                    .contains(&g.part)
                    .then(|| exec.zeros(&[g.len]))
                    .transpose()
            })
            .collect::<Result<_, _>>()?;
        Ok(Grads { data })
    }

    pub fn zero(&mut self, stream: &Stream) -> Result<(), ModelError> {
        for g in self.data.iter_mut().flatten() {
            g.zero(stream)?;
        }
        Ok(())
    }

    /// Whether group `g` trains (has a gradient).
    pub fn has(&self, g: usize) -> bool {
        self.data.get(g).is_some_and(Option::is_some)
    }

    /// The whole gradient of group `g`, if it trains.
    pub fn group_mut(&mut self, g: usize) -> Option<BufferViewMut<'_, f32>> {
        self.data.get_mut(g)?.as_mut().map(Tensor::view_mut)
    }

    /// A gradient tensor by its 5.x name (None if unknown or frozen).
    pub fn get<'a>(&'a self, layout: &ParamLayout, name: &str) -> Option<BufferView<'a, f32>> {
        let (g, s) = layout.find(name)?;
        let t = self.data[g].as_ref()?;
        t.view().slice(layout.groups[g].slots[s].range()).ok()
    }

    /// Host copies of every group (None for frozen ones).
    pub fn to_host(&self, stream: &Stream) -> Result<Vec<Option<Vec<f32>>>, ModelError> {
        Ok(self
            .data
            .iter()
            .map(|t| t.as_ref().map(|t| t.to_host(stream)).transpose())
            .collect::<Result<_, _>>()?)
    }
}

/// A gradient group lent mutably, windowed one tensor at a time by the ranges of its typed
/// view (`S`, e.g. `TextLayer<Range<usize>>`).
#[derive(Debug)]
pub struct GroupGrad<'a, S> {
    pub buf: BufferViewMut<'a, f32>,
    pub at: S,
}

impl<S> GroupGrad<'_, S> {
    /// The gradient of the tensor `pick` names, e.g. `g.win(|r| &r.q)`.
    pub fn win(
        &mut self,
        pick: impl Fn(&S) -> &Range<usize>,
    ) -> Result<BufferViewMut<'_, f32>, KernelError> {
        let r = pick(&self.at).clone();
        Ok(self.buf.slice_mut(r)?)
    }
}

impl Grads {
    /// Group `g`'s gradient with the ranges of its typed view, if it trains.
    pub fn group<S>(&mut self, g: usize, at: S) -> Option<GroupGrad<'_, S>> {
        self.group_mut(g).map(|buf| GroupGrad { buf, at })
    }
}
