//! The learning-rate schedule: linear warm-up, then cosine decay to a floor or constant.
//!
//! ```text
//! step s (0-based: the s-th optimizer update), W warm-up steps, N steps in all:
//! s <  W    lr * (s + 1) / W
//! s >= W    cosine:   min_lr + (lr - min_lr) * (1 + cos(pi * (s - W) / max(1, N - W))) / 2
//!           constant: lr
//! ```
//!
//! The cosine is transformers' `get_cosine_with_min_lr_schedule_with_warmup` (its progress
//! `(s - W) / (N - W)`, so the last step sits just above `min_lr`). The warm-up differs from
//! transformers' `s / W` in one way: the first update uses `lr / W`, not 0, because an update
//! at learning rate 0 still advances AdamW's moments and step count while changing nothing.
//! The schedule is a pure function of the step, so the step alone is its checkpoint state.

use crate::train::config::Schedule;
use serde::{Deserialize, Serialize};

/// The schedule's settings (see the module docs for the formula).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    pub kind: Schedule,
    /// Peak learning rate.
    pub lr: f64,
    /// Floor of the cosine.
    pub min_lr: f64,
    pub warmup_steps: usize,
    /// Optimizer steps of the whole run.
    pub total_steps: usize,
}

impl LrSchedule {
    /// The learning rate of the `step`-th update (0-based).
    pub fn at(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        match self.kind {
            Schedule::Constant => self.lr,
            Schedule::Cosine => {
                let span = self.total_steps.saturating_sub(self.warmup_steps).max(1);
                let progress = ((step - self.warmup_steps) as f64 / span as f64).min(1.0);
                let cos = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
                self.min_lr + (self.lr - self.min_lr) * cos
            }
        }
    }
}
