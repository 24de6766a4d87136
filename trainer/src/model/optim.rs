//! Global-norm gradient clipping and AdamW over the flat groups, on the `cannon_kernels`
//! `grad_clip` and `adamw` device-level ops (torch semantics).
//!
//! Optimizer state (m, v) lives per group on the model's device, beside the group's gradient,
//! and only for groups that train (frozen groups have no gradient and so no state). The f32
//! parameters are the master weights: AdamW updates them in place.
//!
//! With `train.offload_optimizer` the moments live in the exec's host pool instead
//! ([`AdamW::offload`], [`super::offload`]) and pass through the device one group at a time
//! for the update ([`adamw_group`]). The master weights stay on the device: they are also the
//! weights the forward reads (no separate compute copy exists, even in bf16: see
//! [`super::ops`]), so moving them would move every forward's weights, not the optimizer's.

use super::exec::Exec;
use super::offload::HostPool;
use super::params::{Grads, Params};
use super::ModelError;
use cannon_kernels::{ops, KernelError, Tensor};
use cannon_runtime::{BufferView, BufferViewMut, Stream};
use std::sync::Arc;

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
                adamw_group(stream, p, g, m, v, self.step, &hp)?;
            }
        }
        Ok(())
    }

    /// Moves the moments into `exec`'s host pool (`train.offload_optimizer`): from then on
    /// [`AdamW::update`] streams each group's moments through the device for its update.
    pub fn offload(&mut self, exec: &Exec) -> Result<(), ModelError> {
        let pool = exec.host_pool().ok_or_else(|| {
            ModelError::Input(
                "optimizer offload needs an exec with a host pool (Exec::with_host_pool)".into(),
            )
        })?;
        offload_moments(pool, exec.stream(), &mut self.m)?;
        offload_moments(pool, exec.stream(), &mut self.v)?;
        Ok(())
    }
}

/// Moves every moment tensor of `ms` into `pool` (those already there stay).
pub fn offload_moments(
    pool: &HostPool,
    st: &Stream,
    ms: &mut [Option<Tensor<f32>>],
) -> Result<(), KernelError> {
    for t in ms.iter_mut().flatten() {
        if Arc::ptr_eq(t.buffer().allocator(), pool.allocator()) {
            continue;
        }
        let mut host = Tensor::empty_in(pool.allocator(), t.shape())?;
        t.view()
            .memcpy_dtoh(st, host.buffer_mut().as_host_slice_mut()?)?;
        *t = host;
    }
    Ok(())
}

/// One AdamW step of one group: in place when the moments `m`, `v` share the parameters'
/// allocator; otherwise (offloaded to a host pool) they are copied to device tensors for the
/// update and back, one group at a time, so the device holds at most one group's moments.
/// The same kernel runs on the same values either way, so the result is bit-identical.
pub fn adamw_group(
    st: &Stream,
    p: &mut Tensor<f32>,
    g: &Tensor<f32>,
    m: &mut Tensor<f32>,
    v: &mut Tensor<f32>,
    step: u64,
    hp: &AdamWConfig,
) -> Result<(), KernelError> {
    let device = p.buffer().allocator().clone();
    if Arc::ptr_eq(m.buffer().allocator(), &device) {
        let (mut mv, mut vv) = (m.view_mut(), v.view_mut());
        return ops::adamw_step(st, &mut p.view_mut(), &g.view(), &mut mv, &mut vv, step, hp);
    }
    let mut md = Tensor::<f32>::empty_in(&device, m.shape())?;
    md.view_mut().memcpy_htod(st, m.buffer().as_host_slice()?)?;
    let mut vd = Tensor::<f32>::empty_in(&device, v.shape())?;
    vd.view_mut().memcpy_htod(st, v.buffer().as_host_slice()?)?;
    let (mut mv, mut vv) = (md.view_mut(), vd.view_mut());
    ops::adamw_step(st, &mut p.view_mut(), &g.view(), &mut mv, &mut vv, step, hp)?;
    md.view()
        .memcpy_dtoh(st, m.buffer_mut().as_host_slice_mut()?)?;
    vd.view()
        .memcpy_dtoh(st, v.buffer_mut().as_host_slice_mut()?)?;
    Ok(())
}
