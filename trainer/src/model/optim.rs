//! Global-norm gradient clipping and AdamW over the flat groups, on the `cannon_kernels`
//! `grad_clip` and `adamw` device-level ops (torch semantics).
//!
//! Optimizer state (m, v) lives per group on the model's device, beside the group's gradient,
//! and only for groups that train (frozen groups have no gradient and so no state). The f32
//! parameters are the master weights: AdamW updates them in place.

use super::exec::Exec;
use super::params::{Grads, Params};
use super::ModelError;
use cannon_kernels::{ops, KernelError, Tensor};
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// AdamW hyper-parameters (torch.optim.AdamW names).
pub use cannon_kernels::adamw::AdamW as AdamWConfig;

/// `torch.nn.utils.clip_grad_norm_` over every gradient group: scales them all by
/// `max_norm / (total + 1e-6)` when that is below 1 and returns the total L2 norm before
/// clipping. `max_norm <= 0` (or infinite) only measures.
pub fn clip_grad_norm(
    stream: &Stream,
    grads: &mut Grads,
    max_norm: f64,
) -> Result<f64, KernelError> {
    if max_norm > 0.0 && max_norm.is_finite() {
        let mut views: Vec<BufferViewMut<'_, f32>> = grads
            .data
            .iter_mut()
            .flatten()
            .map(Tensor::view_mut)
            .collect();
        ops::clip_grad_norm(stream, &mut views, max_norm)
    } else {
        let views: Vec<BufferView<'_, f32>> =
            grads.data.iter().flatten().map(Tensor::view).collect();
        Ok(ops::grad_sum_squares(stream, &views)?.sqrt())
    }
}

/// AdamW state: step count and the moments of every trained group.
#[derive(Debug)]
pub struct AdamW {
    pub cfg: AdamWConfig,
    pub step: u64,
    pub m: Vec<Option<Tensor<f32>>>,
    pub v: Vec<Option<Tensor<f32>>>,
}

impl AdamW {
    /// Zero moments on `exec`'s device for the groups `grads` holds.
    pub fn new(exec: &Exec, cfg: AdamWConfig, grads: &Grads) -> Result<Self, ModelError> {
        let zeros = || -> Result<Vec<Option<Tensor<f32>>>, KernelError> {
            grads
                .data
                .iter()
                .map(|g| g.as_ref().map(|g| exec.zeros(g.shape())).transpose())
                .collect()
        };
        Ok(AdamW {
            cfg,
            step: 0,
            m: zeros()?,
            v: zeros()?,
        })
    }

    /// One step of `torch.optim.AdamW` at learning rate `lr` on every trained group.
    pub fn update(
        &mut self,
        stream: &Stream,
        params: &mut Params,
        grads: &Grads,
        lr: f64,
    ) -> Result<(), KernelError> {
        self.step += 1;
        let hp = AdamWConfig { lr, ..self.cfg };
        for (((p, g), m), v) in params
            .data
            .iter_mut()
            .zip(&grads.data)
            .zip(&mut self.m)
            .zip(&mut self.v)
        {
            if let (Some(g), Some(m), Some(v)) = (g, m.as_mut(), v.as_mut()) {
                ops::adamw_step(
                    stream,
                    &mut p.view_mut(),
                    &g.view(),
                    &mut m.view_mut(),
                    &mut v.view_mut(),
                    self.step,
                    &hp,
                )?;
            }
        }
        Ok(())
    }
}
