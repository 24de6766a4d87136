//! Global-norm gradient clipping and AdamW, with torch semantics, over the flat groups.
//!
//! Optimizer state (m, v) lives per group, beside the group's gradient, and only for groups
//! that train (frozen groups have no gradient buffer and so no state).

use super::params::{Grads, Params};

/// `torch.nn.utils.clip_grad_norm_`: scales every gradient by
/// `min(1, max_norm / (total + 1e-6))` and returns the total L2 norm before clipping.
/// `max_norm <= 0` (or infinite) only measures.
pub fn clip_grad_norm(grads: &mut Grads, max_norm: f64) -> f64 {
    let total = grads
        .data
        .iter()
        .flatten()
        .flat_map(|g| g.iter())
        .map(|&x| (x as f64) * (x as f64))
        .sum::<f64>()
        .sqrt();
    if max_norm > 0.0 && max_norm.is_finite() {
        let coef = (max_norm / (total + 1e-6)).min(1.0) as f32;
        for g in grads.data.iter_mut().flatten() {
            for x in g.iter_mut() {
                *x *= coef;
            }
        }
    }
    total
}

/// AdamW hyper-parameters (torch.optim.AdamW names).
#[derive(Clone, Copy, Debug)]
pub struct AdamWConfig {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
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

    /// One step of `torch.optim.AdamW` (decoupled decay, bias-corrected) at learning rate `lr`:
    /// `p *= 1 - lr wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    ///  p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)`.
    pub fn update(&mut self, params: &mut Params, grads: &Grads, lr: f64) {
        self.step += 1;
        let c = self.cfg;
        let t = self.step as i32;
        let step_size = lr / (1.0 - c.beta1.powi(t));
        let bc2_sqrt = (1.0 - c.beta2.powi(t)).sqrt();
        let decay = (1.0 - lr * c.weight_decay) as f32;
        let (b1, b2) = (c.beta1 as f32, c.beta2 as f32);
        for (((p, g), m), v) in params
            .data
            .iter_mut()
            .zip(&grads.data)
            .zip(&mut self.m)
            .zip(&mut self.v)
        {
            let (Some(g), Some(m), Some(v)) = (g, m.as_mut(), v.as_mut()) else {
                continue;
            };
            for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
                *p *= decay;
                *m = b1 * *m + (1.0 - b1) * g;
                *v = b2 * *v + (1.0 - b2) * g * g;
                let denom = (*v as f64).sqrt() / bc2_sqrt + c.eps;
                *p -= (step_size * *m as f64 / denom) as f32;
            }
        }
    }
}
