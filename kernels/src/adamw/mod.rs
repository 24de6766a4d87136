//! AdamW with torch.optim.AdamW's semantics and order of operations (single-tensor path):
//!
//! ```text
//! p  = p * (1 - lr * wd)                        decoupled weight decay
//! m  = lerp(m, g, 1 - b1)  = m + (1 - b1) (g - m)
//! v  = v * b2 + (1 - b2) g g
//! bc1 = 1 - b1^t,  bc2 = 1 - b2^t               t = step, 1-based (f64, like Python)
//! denom = sqrt(v) / sqrt(bc2) + eps
//! p  = p + (-lr / bc1) m / denom
//!
//! p (f32 master weights), g, m, v: [N] f32
//! ```
//!
//! Scalars are formed in f64 (torch does that arithmetic in Python floats) and rounded to f32
//! once; the elementwise steps are f32 in torch's order. Work is split into fixed chunks over
//! rayon, each one vectorised loop. For a sharded optimizer call it on the local shard.

mod cpu;
pub mod device;
pub mod host;
pub(crate) mod npu;
#[cfg(test)]
mod tests;

use crate::error::{check_len, KernelError, Result};

/// Hyper-parameters of one step (the learning rate may change every step).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamW {
    /// torch's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2.
    fn default() -> Self {
        AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 1e-2,
        }
    }
}

/// The f32 scalars of step `t`, computed as torch does.
#[derive(Clone, Copy, Debug)]
struct StepScalars {
    decay: f32,        // 1 - lr * wd
    one_minus_b1: f32, // lerp weight
    b2: f32,
    one_minus_b2: f32,
    bc2_sqrt: f32, // sqrt(1 - b2^t)
    eps: f32,
    neg_step_size: f32, // -lr / (1 - b1^t)
}

impl AdamW {
    fn check(&self, step: u64) -> Result<()> {
        let op = "adamw_step";
        let bad = |detail: String| Err(KernelError::InvalidArgument { op, detail });
        if step == 0 {
            return bad("step is 1-based; got 0".into());
        }
        if !(self.lr >= 0.0 && self.lr.is_finite()) {
            return bad(format!("invalid learning rate {}", self.lr));
        }
        for (name, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return bad(format!("invalid {name} {b} (must be in [0, 1))"));
            }
        }
        if !(self.eps >= 0.0 && self.eps.is_finite()) {
            return bad(format!("invalid eps {}", self.eps));
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            return bad(format!("invalid weight_decay {}", self.weight_decay));
        }
        Ok(())
    }

    fn scalars(&self, step: u64) -> StepScalars {
        let t = step as f64;
        let bc1 = 1.0 - self.beta1.powf(t);
        let bc2 = 1.0 - self.beta2.powf(t);
        StepScalars {
            decay: (1.0 - self.lr * self.weight_decay) as f32,
            one_minus_b1: (1.0 - self.beta1) as f32,
            b2: self.beta2 as f32,
            one_minus_b2: (1.0 - self.beta2) as f32,
            bc2_sqrt: bc2.sqrt() as f32,
            eps: self.eps as f32,
            neg_step_size: (-self.lr / bc1) as f32,
        }
    }
}

/// The rules of [`adamw_step`](host::adamw_step) on every backend (the device-level entry point checks them
/// before any backend runs, so the meta device enforces them too): `grads`, `m` and `v` as
/// long as `params` (lengths given), `step` 1-based and valid hyper-parameters.
pub(crate) fn check_step(
    params: usize,
    grads: usize,
    m: usize,
    v: usize,
    step: u64,
    hp: &AdamW,
) -> Result<()> {
    let op = "adamw_step";
    check_len(op, "grads", grads, params)?;
    check_len(op, "m", m, params)?;
    check_len(op, "v", v, params)?;
    hp.check(step)
}
