//! GELU, exact (erf) form — torch's `gelu` default, used by the Mistral3 projector.
//!
//! ```text
//! forward   y[i]   = x Phi(x),                     Phi(x) = erfc(-x / sqrt 2) / 2
//! backward  dx[i] += dy[i] (Phi(x) + x phi(x)),    phi(x) = e^(-x^2/2) / sqrt(2 pi)
//!
//! x, y, dy, dx: [N]
//! ```
//!
//! Phi comes from erfc through the Chebyshev fit of Numerical Recipes (`erfcc`, relative
//! error below 1.2e-7 for every argument), evaluated in f32 with a vectorised exp. Because it
//! is a *relative* bound on erfc, the negative tail (Phi(x) tiny) keeps its relative accuracy,
//! where `1 + erf(x)` would cancel. Arithmetic is f32; bf16 is rounded once on store. The
//! gradient **accumulates** (`dx +=`).

mod cpu;
pub mod device;
pub mod host;
pub(crate) mod npu;
#[cfg(test)]
mod tests;

use crate::error::{check_len, Result};
use cannon_runtime::Float;

/// The rule of [`gelu_forward`](host::gelu_forward) on every backend (the device-level entry point checks it
/// before any backend runs): `y` as long as `x` (lengths given).
pub(crate) fn check_forward(y: usize, x: usize) -> Result<()> {
    check_len("gelu_forward", "y", y, x)
}

/// The rule of [`gelu_backward`](host::gelu_backward) on every backend: `dy` and `dx` as long as `x`.
pub(crate) fn check_backward(dx: usize, dy: usize, x: usize) -> Result<()> {
    check_len("gelu_backward", "dy", dy, x)?;
    check_len("gelu_backward", "dx", dx, x)
}

/// The standard normal CDF Phi(x) in f32 (relative error about 2e-7 for every x), as the
/// kernels compute it. Exposed for tests and for callers that need the same values.
pub fn normal_cdf(x: f32) -> f32 {
    cpu::phi_cdf(x)
}
