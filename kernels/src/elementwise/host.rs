//! The slice-level API of [`super`] on host memory: the CPU kernels themselves, each
//! checking the op's rules and running the code of `cpu.rs`. [`crate::ops`] runs these on
//! the buffers' host slices when the stream is on the CPU.

use super::*;

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
