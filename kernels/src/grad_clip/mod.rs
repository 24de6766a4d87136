//! Global gradient-norm clipping, as torch's `clip_grad_norm_` (L2 norm, `foreach` or not):
//!
//! ```text
//! norm = sqrt(sum over all slices, all elements of g^2)      (accumulated in f64)
//! coef = max_norm / (norm + 1e-6);  if coef < 1: g *= coef   (every slice)
//! returns norm (before clipping)
//! ```
//!
//! For sharded gradients (FSDP), each rank computes [`grad_sum_squares`](host::grad_sum_squares) over its shards, the
//! trainer all-reduces (sums) that f64 across ranks, and [`clip_with_sum_squares`](host::clip_with_sum_squares) finishes:
//! every rank then applies the same coefficient. [`clip_grad_norm`](host::clip_grad_norm) is the one-process form.
//!
//! A non-finite norm: with +inf the coefficient is 0 and the gradients are zeroed (as torch
//! does); with NaN nothing is scaled (torch would write NaN everywhere). In both cases the
//! returned norm tells the caller to skip the step. Sums are formed over fixed chunks in a
//! fixed order, so the norm is bit-reproducible whatever the thread count.

mod cpu;
pub mod device;
pub mod host;
pub(crate) mod npu;
#[cfg(test)]
mod tests;

use crate::error::{KernelError, Result};

/// Added to the norm in the coefficient's denominator (torch's constant).
pub const CLIP_EPS: f64 = 1e-6;

/// The factor the gradients are multiplied by for `norm`, or `None` when they are left alone
/// (`max_norm / (norm + 1e-6) >= 1`, or the norm is NaN).
pub fn clip_coefficient(norm: f64, max_norm: f64) -> Option<f64> {
    let coef = max_norm / (norm + CLIP_EPS);
    (coef < 1.0).then_some(coef)
}
