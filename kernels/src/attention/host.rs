//! The slice-level API of [`super`] on host memory: the CPU kernels themselves, each
//! checking the op's rules and running the code of `cpu.rs`. [`crate::ops`] runs these on
//! the buffers' host slices when the stream is on the CPU.

use super::*;

pub use super::block::{
    backward_accumulate as block_backward_accumulate, forward_merge as block_forward_merge,
};

/// Forward: writes `out [T, Hq, D]` and `lse [T, Hq]` (both overwritten).
pub fn forward<E: Float>(
    a: &VarlenAttention,
    x: Qkv<E>,
    out: &mut [E],
    lse: &mut [f32],
) -> Result<()> {
    check_forward(a, 1, x.lens(), out.len(), lse.len())?;
    cpu::forward(cpu::Isa::detect(), a, x, out, lse);
    Ok(())
}

/// Backward: from the forward's inputs, its `out` and `lse`, and `dout [T, Hq, D]`, OVERWRITES
/// `dq [T, Hq, D]`, `dk [T, Hkv, D]`, `dv [T, Hkv, D]`.
pub fn backward<E: Float>(
    a: &VarlenAttention,
    x: Qkv<E>,
    out: &[E],
    lse: &[f32],
    dout: &[E],
    g: QkvGrad<E>,
) -> Result<()> {
    let grads = [g.dq.len(), g.dk.len(), g.dv.len()];
    check_backward(a, 1, x.lens(), (out.len(), lse.len(), dout.len()), grads)?;
    cpu::backward(
        cpu::Isa::detect(),
        cpu::BwdSchedule::Auto,
        a,
        x,
        cpu::BwdSaved { out, lse, dout },
        g,
    );
    Ok(())
}
