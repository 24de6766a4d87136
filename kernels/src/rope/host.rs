//! The slice-level API of [`super`] on host memory: the CPU kernels themselves, each
//! checking the op's rules and running the code of `cpu.rs`. [`crate::ops`] runs these on
//! the buffers' host slices when the stream is on the CPU.

use super::*;

/// Rotates `x [T, H, D]` in place by the angles of each token's slot `pos [T]`.
pub fn rope_forward<E: Float>(
    x: &mut [E],
    n_heads: usize,
    table: &RopeTable,
    pos: &[u32],
) -> Result<()> {
    check_apply("rope_forward", x, n_heads, table, pos)?;
    cpu::rotate(x, n_heads, table, pos, 1.0);
    Ok(())
}

/// Backward of [`rope_forward`]: on entry `dx` [T, H, D] holds d loss / d(rotated x), on exit
/// d loss / d x (the inverse rotation, in place; nothing accumulates).
pub fn rope_backward<E: Float>(
    dx: &mut [E],
    n_heads: usize,
    table: &RopeTable,
    pos: &[u32],
) -> Result<()> {
    check_apply("rope_backward", dx, n_heads, table, pos)?;
    cpu::rotate(dx, n_heads, table, pos, -1.0);
    Ok(())
}
