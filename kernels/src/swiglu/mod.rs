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
pub mod device;
pub mod host;
pub(crate) mod npu;
#[cfg(test)]
mod tests;

use crate::error::{check_len, Result};
use cannon_runtime::Float;

/// The rule of [`swiglu_forward`](host::swiglu_forward) on every backend (the device-level entry point checks it
/// before any backend runs): `up` and `h` as long as `gate` (lengths given).
pub(crate) fn check_forward(h: usize, gate: usize, up: usize) -> Result<()> {
    check_len("swiglu_forward", "up", up, gate)?;
    check_len("swiglu_forward", "h", h, gate)
}

/// The rule of [`swiglu_backward`](host::swiglu_backward) on every backend: `up`, `dh`, `d_gate` and `d_up` as long
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
