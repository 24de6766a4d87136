//! Global-norm gradient clipping and AdamW over the flat groups, on the `cannon_kernels`
//! `grad_clip` and `adamw` ops (torch semantics).
//!
//! Optimizer state (m, v) lives per group, beside the group's gradient, and only for groups
//! that train (frozen groups have no gradient buffer and so no state).

use super::params::{Grads, Params};
use cannon_kernels::{adamw, grad_clip, KernelError};

/// AdamW hyper-parameters (torch.optim.AdamW names).
pub use cannon_kernels::adamw::AdamW as AdamWConfig;

/// `torch.nn.utils.clip_grad_norm_` over every gradient group: scales them all by
/// `max_norm / (total + 1e-6)` when that is below 1 and returns the total L2 norm before
/// clipping. `max_norm <= 0` (or infinite) only measures.
pub fn clip_grad_norm(grads: &mut Grads, max_norm: f64) -> Result<f64, KernelError> {
    let mut groups: Vec<&mut Vec<f32>> = grads.data.iter_mut().flatten().collect();
    if max_norm > 0.0 && max_norm.is_finite() {
        grad_clip::clip_grad_norm(&mut groups, max_norm)
    } else {
        Ok(grad_clip::grad_sum_squares(&groups).sqrt())
    }
}

/// AdamW state: step count and the moments of every trained group.
#[derive(Clone, Debug)]
pub struct AdamW {
    pub cfg: AdamWConfig,
    pub step: u64,
    pub m: Vec<Option<Vec<f32>>>,
    pub v: Vec<Option<Vec<f32>>>,
}

impl AdamW {
    /// Zero moments for the groups `grads` holds.
    pub fn new(cfg: AdamWConfig, grads: &Grads) -> Self {
        let zeros = || {
            grads
                .data
                .iter()
                .map(|g| g.as_ref().map(|g| vec![0.0; g.len()]))
                .collect()
        };
        AdamW {
            cfg,
            step: 0,
            m: zeros(),
            v: zeros(),
        }
    }

    /// One step of `torch.optim.AdamW` at learning rate `lr` on every trained group.
    pub fn update(
        &mut self,
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
                adamw::adamw_step(p, g, m, v, self.step, &hp)?;
            }
        }
        Ok(())
    }
}
