//! RoPE on runtime buffers: the device-level entry points
//! (re-exported by [`crate::ops`]).
//!
//! Each runs the op's check (the rule its slice-level function and NPU body apply too, so
//! the meta device rejects what the CPU would), selects the backend once (every operand on
//! the stream's device, [`backend::select`]), and matches on it: the CPU arm
//! ([`on_cpu`]) borrows the buffers' host slices for [`super::host`], the NPU arm is the
//! op's aclnn body (`npu.rs`), the meta arm computes nothing.

use super::npu;
use super::RopeTable;
use crate::backend::{self, Npu, Selected};
use crate::error::Result;
use cannon_runtime::trace;
use cannon_runtime::Float;
use cannon_runtime::{BufferViewMut, Stream};

/// [`crate::rope::host::rope_forward`] on `stream`'s device:
/// Rotates `x` in place by the angles of `pos` ([`crate::rope`]).
pub fn rope_forward<E: Float>(
    stream: &Stream,
    x: &mut BufferViewMut<'_, E>,
    n_heads: usize,
    table: &RopeTable,
    pos: &[u32],
) -> Result<()> {
    super::check_apply_len("rope_forward", x.len(), n_heads, table, pos)?;
    let _span = trace::span_on(stream, "rope_forward", trace::Cat::Norm);
    match backend::select("rope_forward", stream, &[&x])? {
        Selected::Cpu(_) => on_cpu::rope_forward(x, n_heads, table, pos),
        Selected::Npu(Npu { ordinal }) => npu::forward(ordinal, stream, x, n_heads, table, pos),
        Selected::Meta(_) => Ok(()),
    }
}

/// [`crate::rope::host::rope_backward`] on `stream`'s device:
/// The inverse rotation of `dx`, in place.
pub fn rope_backward<E: Float>(
    stream: &Stream,
    dx: &mut BufferViewMut<'_, E>,
    n_heads: usize,
    table: &RopeTable,
    pos: &[u32],
) -> Result<()> {
    super::check_apply_len("rope_backward", dx.len(), n_heads, table, pos)?;
    let _span = trace::span_on(stream, "rope_backward", trace::Cat::Norm);
    match backend::select("rope_backward", stream, &[&dx])? {
        Selected::Cpu(_) => on_cpu::rope_backward(dx, n_heads, table, pos),
        Selected::Npu(Npu { ordinal }) => npu::backward(ordinal, stream, dx, n_heads, table, pos),
        Selected::Meta(_) => Ok(()),
    }
}

/// The CPU arm of each entry point: the buffers' host slices passed to the slice-level
/// function, without the entry's check or device selection (the slice-level function checks
/// by itself; tests compare the two).
pub mod on_cpu {
    use super::*;
    use crate::rope::host;

    pub fn rope_forward<E: Float>(
        x: &mut BufferViewMut<'_, E>,
        n_heads: usize,
        table: &RopeTable,
        pos: &[u32],
    ) -> Result<()> {
        host::rope_forward(x.as_host_slice_mut()?, n_heads, table, pos)
    }

    pub fn rope_backward<E: Float>(
        dx: &mut BufferViewMut<'_, E>,
        n_heads: usize,
        table: &RopeTable,
        pos: &[u32],
    ) -> Result<()> {
        host::rope_backward(dx.as_host_slice_mut()?, n_heads, table, pos)
    }
}
