//! The slice-level API of [`super`] on host memory: the CPU kernels themselves, each
//! checking the op's rules and running the code of `cpu.rs`. [`crate::ops`] runs these on
//! the buffers' host slices when the stream is on the CPU.

use super::*;

/// Normalises each row of `x [T, D]` and scales it by `weight [D]` into `out [T, D]`; saves
/// `rstd [T]` for the backward.
pub fn rmsnorm_forward<E: Float>(
    out: &mut [E],
    rstd: &mut [f32],
    x: &[E],
    weight: &[E],
    dim: usize,
    eps: f32,
) -> Result<()> {
    check_forward(out.len(), rstd.len(), x.len(), weight.len(), dim)?;
    cpu::forward(out, rstd, x, weight, dim, eps);
    Ok(())
}

/// Accumulates the gradients of [`rmsnorm_forward`]: `dx` [T, D] += d out/d x . `dout`, and
/// `dweight [D]` += sum over rows of `dout * n`. `rstd [T]` is the forward's.
pub fn rmsnorm_backward<E: Float>(
    dx: &mut [E],
    dweight: &mut [f32],
    dout: &[E],
    x: &[E],
    weight: &[E],
    rstd: &[f32],
    dim: usize,
) -> Result<()> {
    let (dxl, dwl) = (dx.len(), dweight.len());
    check_backward(dxl, dwl, dout.len(), x.len(), weight.len(), rstd.len(), dim)?;
    cpu::backward(dx, dweight, dout, x, weight, rstd, dim);
    Ok(())
}
