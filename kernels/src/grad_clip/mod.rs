//! Global gradient-norm clipping, as torch's `clip_grad_norm_` (L2 norm, `foreach` or not):
//!
//! ```text
//! norm = sqrt(sum over all slices, all elements of g^2)      (accumulated in f64)
//! coef = max_norm / (norm + 1e-6);  if coef < 1: g *= coef   (every slice)
//! returns norm (before clipping)
//! ```
//!
//! For sharded gradients (FSDP), each rank computes [`grad_sum_squares`] over its shards, the
//! trainer all-reduces (sums) that f64 across ranks, and [`clip_with_sum_squares`] finishes:
//! every rank then applies the same coefficient. [`clip_grad_norm`] is the one-process form.
//!
//! A non-finite norm: with +inf the coefficient is 0 and the gradients are zeroed (as torch
//! does); with NaN nothing is scaled (torch would write NaN everywhere). In both cases the
//! returned norm tells the caller to skip the step. Sums are formed over fixed chunks in a
//! fixed order, so the norm is bit-reproducible whatever the thread count.

mod cpu;
pub(crate) mod npu;
#[cfg(test)]
mod tests;

use crate::error::{KernelError, Result};

/// Added to the norm in the coefficient's denominator (torch's constant).
pub const CLIP_EPS: f64 = 1e-6;

/// Sum of squares of every element of every slice, in f64.
pub fn grad_sum_squares<S: AsRef<[f32]> + Sync>(grads: &[S]) -> f64 {
    grads
        .iter()
        .fold(0.0, |acc, g| acc + cpu::sum_squares(g.as_ref()))
}

/// The factor the gradients are multiplied by for `norm`, or `None` when they are left alone
/// (`max_norm / (norm + 1e-6) >= 1`, or the norm is NaN).
pub fn clip_coefficient(norm: f64, max_norm: f64) -> Option<f64> {
    let coef = max_norm / (norm + CLIP_EPS);
    (coef < 1.0).then_some(coef)
}

/// Multiplies every element of every slice by `coef`.
pub fn scale_grads<S: AsMut<[f32]> + Send>(grads: &mut [S], coef: f32) {
    for g in grads.iter_mut() {
        cpu::scale(g.as_mut(), coef);
    }
}

/// Clips given the global sum of squares (already reduced across ranks); returns the norm.
pub fn clip_with_sum_squares<S: AsMut<[f32]> + Send>(
    grads: &mut [S],
    total_sum_squares: f64,
    max_norm: f64,
) -> Result<f64> {
    if !(max_norm >= 0.0 && max_norm.is_finite()) {
        return Err(KernelError::InvalidArgument {
            op: "clip_grad_norm",
            detail: format!("max_norm must be finite and >= 0, got {max_norm}"),
        });
    }
    let norm = total_sum_squares.sqrt();
    if let Some(coef) = clip_coefficient(norm, max_norm) {
        // torch multiplies by the coefficient as a tensor of the gradients' dtype (f32).
        scale_grads(grads, coef as f32);
    }
    Ok(norm)
}

/// torch's `clip_grad_norm_(grads, max_norm)` on one process; returns the pre-clip norm.
pub fn clip_grad_norm<S: AsRef<[f32]> + AsMut<[f32]> + Send + Sync>(
    grads: &mut [S],
    max_norm: f64,
) -> Result<f64> {
    let ss = grad_sum_squares(grads);
    clip_with_sum_squares(grads, ss, max_norm)
}
