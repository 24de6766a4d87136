//! The slice-level API of [`super`] on host memory: the CPU kernels themselves, each
//! checking the op's rules and running the code of `cpu.rs`. [`crate::ops`] runs these on
//! the buffers' host slices when the stream is on the CPU.

use super::*;

/// One AdamW step `step` (1-based) on `params` with gradient `grads`, updating the moments
/// `m` and `v` in place. All four slices: `[N]`.
pub fn adamw_step(
    params: &mut [f32],
    grads: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    step: u64,
    hp: &AdamW,
) -> Result<()> {
    check_step(params.len(), grads.len(), m.len(), v.len(), step, hp)?;
    cpu::step(params, grads, m, v, &hp.scalars(step));
    Ok(())
}
