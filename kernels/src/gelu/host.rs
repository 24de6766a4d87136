//! The slice-level API of [`super`] on host memory: the CPU kernels themselves, each
//! checking the op's rules and running the code of `cpu.rs`. [`crate::ops`] runs these on
//! the buffers' host slices when the stream is on the CPU.

use super::*;

/// `y = gelu(x)`, elementwise. x, y: `[N]`.
pub fn gelu_forward<E: Float>(y: &mut [E], x: &[E]) -> Result<()> {
    check_forward(y.len(), x.len())?;
    cpu::forward(y, x);
    Ok(())
}

/// `dx += dy * gelu'(x)`, elementwise. dx, dy, x: `[N]`.
pub fn gelu_backward<E: Float>(dx: &mut [E], dy: &[E], x: &[E]) -> Result<()> {
    check_backward(dx.len(), dy.len(), x.len())?;
    cpu::backward(dx, dy, x);
    Ok(())
}
