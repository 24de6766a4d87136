//! Elementwise arithmetic on whole buffers: the residual add and the products of a gated MLP
//! whose gate activation has no fused kernel (Pixtral's GELU gate).
//!
//! ```text
//! add_into   y[i] += x[i]
//! mul        out[i] = a[i] * b[i]
//! mul_into   y[i] *= x[i]
//!
//! x, y, a, b, out: [N]
//! ```
//!
//! Arithmetic is f32; a bf16 result is rounded once on store (nearest even), so for f32 these
//! are the plain IEEE operations, bit for bit what a host loop `y += x` gives.

mod cpu;
pub mod npu;
#[cfg(test)]
mod tests;

use crate::error::{check_len, Result};
use cannon_runtime::Float;

/// `y += x`, elementwise. x, y: `[N]`.
pub fn add_into<E: Float>(y: &mut [E], x: &[E]) -> Result<()> {
    check_add_into(y.len(), x.len())?;
    cpu::add_into(y, x);
    Ok(())
}

/// `out = a * b`, elementwise. a, b, out: `[N]`.
pub fn mul<E: Float>(out: &mut [E], a: &[E], b: &[E]) -> Result<()> {
    check_mul(out.len(), a.len(), b.len())?;
    cpu::mul(out, a, b);
    Ok(())
}

/// `y *= x`, elementwise. x, y: `[N]`.
pub fn mul_into<E: Float>(y: &mut [E], x: &[E]) -> Result<()> {
    check_mul_into(y.len(), x.len())?;
    cpu::mul_into(y, x);
    Ok(())
}

// The rules of the three ops on every backend (the device-level entry points check them
// before any backend runs), on the operands' lengths: every operand as long as the others.

/// [`add_into`]: `x` as long as `y`.
pub(crate) fn check_add_into(y: usize, x: usize) -> Result<()> {
    check_len("add_into", "x", x, y)
}

/// [`mul`]: `b` and `out` as long as `a`.
pub(crate) fn check_mul(out: usize, a: usize, b: usize) -> Result<()> {
    check_len("mul", "b", b, a)?;
    check_len("mul", "out", out, a)
}

/// [`mul_into`]: `x` as long as `y`.
pub(crate) fn check_mul_into(y: usize, x: usize) -> Result<()> {
    check_len("mul_into", "x", x, y)
}
