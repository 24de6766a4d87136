//! The slice-level API of [`super`] on host memory: the CPU kernels themselves, each
//! checking the op's rules and running the code of `cpu.rs`. [`crate::ops`] runs these on
//! the buffers' host slices when the stream is on the CPU.

use super::*;

/// Converts between any two storage types (f32 -> f32 is a parallel copy). src, dst: `[N]`.
pub fn cast<A: Float, B: Float>(src: &[A], dst: &mut [B]) -> Result<()> {
    check_cast(src.len(), dst.len())?;
    cpu::convert(src, dst);
    Ok(())
}
