//! The embedding on runtime buffers: the device-level entry points
//! (re-exported by [`crate::ops`]).
//!
//! Each runs the op's check (the rule its slice-level function and NPU body apply too, so
//! the meta device rejects what the CPU would), selects the backend once (every operand on
//! the stream's device, [`backend::select`]), and matches on it: the CPU arm
//! ([`on_cpu`]) borrows the buffers' host slices for [`super::host`], the NPU arm is the
//! op's aclnn body (`npu.rs`), the meta arm computes nothing.

use super::npu;
use crate::backend::{self, Npu, Selected};
use crate::error::Result;
use cannon_runtime::trace;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// [`crate::embedding::host::embedding_forward`] on `stream`'s device:
/// Gathers rows `ids` of `weight` ([`crate::embedding`]).
pub fn embedding_forward<E: Float>(
    stream: &Stream,
    out: &mut BufferViewMut<'_, E>,
    ids: &[u32],
    weight: &BufferView<'_, E>,
    dim: usize,
) -> Result<()> {
    super::check_forward(out.len(), ids, weight.len(), dim)?;
    let _span = trace::span_on(stream, "embedding_forward", trace::Cat::Norm);
    match backend::select("embedding_forward", stream, &[&out, &weight])? {
        Selected::Cpu(_) => on_cpu::embedding_forward(out, ids, weight, dim),
        Selected::Npu(Npu { ordinal }) => npu::forward(ordinal, stream, out, ids, weight, dim),
        Selected::Meta(_) => Ok(()),
    }
}

/// [`crate::embedding::host::embedding_backward`] on `stream`'s device:
/// `dweight[ids[t]] += dout[t]`.
pub fn embedding_backward<E: Float>(
    stream: &Stream,
    dweight: &mut BufferViewMut<'_, f32>,
    dout: &BufferView<'_, E>,
    ids: &[u32],
    dim: usize,
) -> Result<()> {
    super::check_backward(dweight.len(), dout.len(), ids, dim)?;
    let _span = trace::span_on(stream, "embedding_backward", trace::Cat::Norm);
    match backend::select("embedding_backward", stream, &[&dweight, &dout])? {
        Selected::Cpu(_) => on_cpu::embedding_backward(dweight, dout, ids, dim),
        Selected::Npu(Npu { ordinal }) => npu::backward(ordinal, stream, dweight, dout, ids, dim),
        Selected::Meta(_) => Ok(()),
    }
}

/// The CPU arm of each entry point: the buffers' host slices passed to the slice-level
/// function, without the entry's check or device selection (the slice-level function checks
/// by itself; tests compare the two).
pub mod on_cpu {
    use super::*;
    use crate::embedding::host;

    pub fn embedding_forward<E: Float>(
        out: &mut BufferViewMut<'_, E>,
        ids: &[u32],
        weight: &BufferView<'_, E>,
        dim: usize,
    ) -> Result<()> {
        host::embedding_forward(out.as_host_slice_mut()?, ids, weight.as_host_slice()?, dim)
    }

    pub fn embedding_backward<E: Float>(
        dweight: &mut BufferViewMut<'_, f32>,
        dout: &BufferView<'_, E>,
        ids: &[u32],
        dim: usize,
    ) -> Result<()> {
        host::embedding_backward(
            dweight.as_host_slice_mut()?,
            dout.as_host_slice()?,
            ids,
            dim,
        )
    }
}
