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
pub mod device;
pub mod host;
pub mod npu;
#[cfg(test)]
mod tests;

use crate::error::{check_len, Result};
use cannon_runtime::Float;

// The rules of the three ops on every backend (the device-level entry points check them
// before any backend runs), on the operands' lengths: every operand as long as the others.

/// [`add_into`](host::add_into): `x` as long as `y`.
pub(crate) fn check_add_into(y: usize, x: usize) -> Result<()> {
    check_len("add_into", "x", x, y)
}

/// [`mul`](host::mul): `b` and `out` as long as `a`.
pub(crate) fn check_mul(out: usize, a: usize, b: usize) -> Result<()> {
    check_len("mul", "b", b, a)?;
    check_len("mul", "out", out, a)
}

/// [`mul_into`](host::mul_into): `x` as long as `y`.
pub(crate) fn check_mul_into(y: usize, x: usize) -> Result<()> {
    check_len("mul_into", "x", x, y)
}
