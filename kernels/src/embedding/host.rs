//! The slice-level API of [`super`] on host memory: the CPU kernels themselves, each
//! checking the op's rules and running the code of `cpu.rs`. [`crate::ops`] runs these on
//! the buffers' host slices when the stream is on the CPU.

use super::*;

/// Gathers rows of `weight` [V, D] into `out` [T, D].
pub fn embedding_forward<E: Float>(
    out: &mut [E],
    ids: &[u32],
    weight: &[E],
    dim: usize,
) -> Result<()> {
    check_forward(out.len(), ids, weight.len(), dim)?;
    cpu::forward(out, ids, weight, dim);
    Ok(())
}

/// Adds each token's `dout` [T, D] row into row `ids[t]` of `dweight` [V, D].
pub fn embedding_backward<E: Float>(
    dweight: &mut [f32],
    dout: &[E],
    ids: &[u32],
    dim: usize,
) -> Result<()> {
    let vocab = check_backward(dweight.len(), dout.len(), ids, dim)?;
    cpu::backward(dweight, dout, ids, vocab, dim);
    Ok(())
}
