//! The slice-level API of [`super`] on host memory: the CPU kernels themselves, each
//! checking the op's rules and running the code of `cpu.rs`. [`crate::ops`] runs these on
//! the buffers' host slices when the stream is on the CPU.

use super::*;

/// Sum of squares of every element of every slice, in f64.
pub fn grad_sum_squares<S: AsRef<[f32]> + Sync>(grads: &[S]) -> f64 {
    grads
        .iter()
        .fold(0.0, |acc, g| acc + cpu::sum_squares(g.as_ref()))
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
