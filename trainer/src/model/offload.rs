//! What the optimizer keeps across steps (one group's f32 master weights, or one of its AdamW
//! moments): on the device, or, with `train.offload_optimizer`, in the exec's host pool
//! ([`cannon_runtime::HostPool`]; [`cannon_runtime::offload`] says how values move between
//! the two).

use cannon_kernels::{KernelError, Tensor};
use cannon_runtime::{HostPool, HostTensor, Stream};

type Result<T> = std::result::Result<T, KernelError>;

/// A tensor held across steps (one group's f32 master weights, or one of its AdamW
/// moments): on the model's device, or (`train.offload_optimizer`) in the exec's host pool,
/// where no kernel reads it: a pass fetches a copy ([`super::source`]) and the optimizer
/// streams it through the device ([`super::optim::adamw_group`]).
#[derive(Debug)]
pub enum Stored {
    Device(Tensor<f32>),
    /// Boxed: the host side (with its pinned copy and events on an NPU) is larger than a
    /// device tensor.
    Host(Box<HostTensor<f32>>),
}

impl Stored {
    pub fn numel(&self) -> usize {
        match self {
            Stored::Device(t) => t.numel(),
            Stored::Host(h) => h.numel(),
        }
    }

    /// Whether the values are in a host pool.
    pub fn is_host(&self) -> bool {
        matches!(self, Stored::Host(_))
    }

    /// The device tensor (None when the values are in a host pool).
    pub fn device_tensor(&self) -> Option<&Tensor<f32>> {
        match self {
            Stored::Device(t) => Some(t),
            Stored::Host(_) => None,
        }
    }

    /// The device tensor, mutably (None when the values are in a host pool).
    pub fn device_tensor_mut(&mut self) -> Option<&mut Tensor<f32>> {
        match self {
            Stored::Device(t) => Some(t),
            Stored::Host(_) => None,
        }
    }

    /// A host copy of the values (`st`: the device tensor's stream).
    pub fn to_host(&self, st: &Stream) -> Result<Vec<f32>> {
        match self {
            Stored::Device(t) => t.to_host(st),
            Stored::Host(h) => Ok(h.to_vec()?),
        }
    }

    /// Overwrites the values from `offset` on with host `values`.
    pub fn write_at(&mut self, st: &Stream, offset: usize, values: &[f32]) -> Result<()> {
        match self {
            Stored::Device(t) => {
                let range = offset..offset.saturating_add(values.len());
                Ok(t.buffer_mut().slice_mut(range)?.memcpy_htod(st, values)?)
            }
            Stored::Host(h) => Ok(h.write_at(offset, values)?),
        }
    }

    /// Overwrites every value with host `values` (of the same length).
    pub fn write(&mut self, st: &Stream, values: &[f32]) -> Result<()> {
        let n = self.numel();
        if values.len() != n {
            return Err(KernelError::InvalidArgument {
                op: "Stored::write",
                detail: format!("{} values for a tensor of {n}", values.len()),
            });
        }
        self.write_at(st, 0, values)
    }

    /// A copy in the same place.
    pub fn try_clone(&self, st: &Stream) -> Result<Self> {
        Ok(match self {
            Stored::Device(t) => Stored::Device(t.try_clone(st)?),
            Stored::Host(h) => Stored::Host(Box::new(h.try_clone()?)),
        })
    }

    /// Moves the values into `pool` (nothing to do when they are there already); the device
    /// tensor is freed when this returns.
    pub fn offload(&mut self, pool: &HostPool, st: &Stream) -> Result<()> {
        if self.is_host() {
            return Ok(());
        }
        let placeholder = Stored::Host(Box::new(HostTensor::vacant()));
        if let Stored::Device(t) = std::mem::replace(self, placeholder) {
            let shape = t.shape().to_vec();
            *self = Stored::Host(Box::new(pool.keep(st, t.into_buffer(), &shape)?));
        }
        Ok(())
    }
}
