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
    check_len("swiglu_forward", "up", up.len(), gate.len())?;
    check_len("swiglu_forward", "h", h.len(), gate.len())?;
    cpu::forward(h, gate, up);
    Ok(())
}

/// Accumulates the gradients of [`swiglu_forward`] into `d_gate` and `d_up`. All: `[N]`.
pub fn swiglu_backward<E: Float>(
    d_gate: &mut [E],
    d_up: &mut [E],
    dh: &[E],
    gate: &[E],
    up: &[E],
) -> Result<()> {
    let op = "swiglu_backward";
    let n = gate.len();
    check_len(op, "up", up.len(), n)?;
    check_len(op, "dh", dh.len(), n)?;
    check_len(op, "d_gate", d_gate.len(), n)?;
    check_len(op, "d_up", d_up.len(), n)?;
    cpu::backward(d_gate, d_up, dh, gate, up);
    Ok(())
}
