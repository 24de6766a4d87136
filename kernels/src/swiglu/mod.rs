//! The gated activation of the SwiGLU MLP (`down(silu(gate(x)) * up(x))`); the three linear
//! layers around it belong to `linear`.
//!
//! ```text
//! forward   h[i]       = round_E(round_E(silu(gate[i])) * up[i]),  silu(g) = g / (1 + e^-g)
//! backward  d_gate[i] += dh[i] * up[i] * s (1 + g (1 - s)),        s = sigmoid(g)
//!           d_up[i]   += dh[i] * silu(g)
//!
//! gate, up, h, dh, d_gate, d_up: [N]   (N = T * I, the gate and up projections' outputs)
//! ```
//!
//! All arithmetic is f32. For bf16, silu is rounded to bf16 before the product, as
//! transformers' `act_fn(gate) * up` does in bf16; for f32 the rounding is the identity.
//! The gradients **accumulate** (`+=`, llm.c's convention): zero them first if needed.

mod cpu;
pub(crate) mod npu;
#[cfg(test)]
mod tests;

use crate::error::{check_len, Result};
use cannon_runtime::Float;

/// `h = silu(gate) * up`, elementwise. gate, up, h: `[N]`.
pub fn swiglu_forward<E: Float>(h: &mut [E], gate: &[E], up: &[E]) -> Result<()> {
    check_forward(h.len(), gate.len(), up.len())?;
    cpu::forward(h, gate, up);
    Ok(())
}

/// The rule of [`swiglu_forward`] on every backend (the device-level entry point checks it
/// before any backend runs): `up` and `h` as long as `gate` (lengths given).
pub(crate) fn check_forward(h: usize, gate: usize, up: usize) -> Result<()> {
    check_len("swiglu_forward", "up", up, gate)?;
    check_len("swiglu_forward", "h", h, gate)
}

/// Accumulates the gradients of [`swiglu_forward`] into `d_gate` and `d_up`. All: `[N]`.
pub fn swiglu_backward<E: Float>(
    d_gate: &mut [E],
    d_up: &mut [E],
    dh: &[E],
    gate: &[E],
    up: &[E],
) -> Result<()> {
    check_backward(d_gate.len(), d_up.len(), dh.len(), gate.len(), up.len())?;
    cpu::backward(d_gate, d_up, dh, gate, up);
    Ok(())
}

/// The rule of [`swiglu_backward`] on every backend: `up`, `dh`, `d_gate` and `d_up` as long
/// as `gate`.
pub(crate) fn check_backward(
    d_gate: usize,
    d_up: usize,
    dh: usize,
    gate: usize,
    up: usize,
) -> Result<()> {
    let op = "swiglu_backward";
    for (what, len) in [("up", up), ("dh", dh), ("d_gate", d_gate), ("d_up", d_up)] {
        check_len(op, what, len, gate)?;
    }
    Ok(())
}
