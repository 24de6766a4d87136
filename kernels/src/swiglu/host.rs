//! The slice-level API of [`super`] on host memory: the CPU kernels themselves, each
//! checking the op's rules and running the code of `cpu.rs`. [`crate::ops`] runs these on
//! the buffers' host slices when the stream is on the CPU.

use super::*;

/// `h = silu(gate) * up`, elementwise. gate, up, h: `[N]`.
pub fn swiglu_forward<E: Float>(h: &mut [E], gate: &[E], up: &[E]) -> Result<()> {
    check_forward(h.len(), gate.len(), up.len())?;
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
    check_backward(d_gate.len(), d_up.len(), dh.len(), gate.len(), up.len())?;
    cpu::backward(d_gate, d_up, dh, gate, up);
    Ok(())
}
