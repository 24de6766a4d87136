//! GELU on runtime buffers: the device-level entry points
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

/// [`crate::gelu::host::gelu_forward`] on `stream`'s device:
/// `y = gelu(x)` ([`crate::gelu`]).
pub fn gelu_forward<E: Float>(
    stream: &Stream,
    y: &mut BufferViewMut<'_, E>,
    x: &BufferView<'_, E>,
) -> Result<()> {
    super::check_forward(y.len(), x.len())?;
    let _span = trace::span_on(stream, "gelu_forward", trace::Cat::Norm);
    match backend::select("gelu_forward", stream, &[&y, &x])? {
        Selected::Cpu(_) => on_cpu::gelu_forward(y, x),
        Selected::Npu(Npu { ordinal }) => npu::forward(ordinal, stream, y, x),
        Selected::Meta(_) => Ok(()),
    }
}

/// [`crate::gelu::host::gelu_backward`] on `stream`'s device:
/// `dx += dy * gelu'(x)`.
pub fn gelu_backward<E: Float>(
    stream: &Stream,
    dx: &mut BufferViewMut<'_, E>,
    dy: &BufferView<'_, E>,
    x: &BufferView<'_, E>,
) -> Result<()> {
    super::check_backward(dx.len(), dy.len(), x.len())?;
    let _span = trace::span_on(stream, "gelu_backward", trace::Cat::Norm);
    match backend::select("gelu_backward", stream, &[&dx, &dy, &x])? {
        Selected::Cpu(_) => on_cpu::gelu_backward(dx, dy, x),
        Selected::Npu(Npu { ordinal }) => npu::backward(ordinal, stream, dx, dy, x),
        Selected::Meta(_) => Ok(()),
    }
}

/// The CPU arm of each entry point: the buffers' host slices passed to the slice-level
/// function, without the entry's check or device selection (the slice-level function checks
/// by itself; tests compare the two).
pub mod on_cpu {
    use super::*;
    use crate::gelu::host;

    pub fn gelu_forward<E: Float>(
        y: &mut BufferViewMut<'_, E>,
        x: &BufferView<'_, E>,
    ) -> Result<()> {
        host::gelu_forward(y.as_host_slice_mut()?, x.as_host_slice()?)
    }

    pub fn gelu_backward<E: Float>(
        dx: &mut BufferViewMut<'_, E>,
        dy: &BufferView<'_, E>,
        x: &BufferView<'_, E>,
    ) -> Result<()> {
        host::gelu_backward(
            dx.as_host_slice_mut()?,
            dy.as_host_slice()?,
            x.as_host_slice()?,
        )
    }
}
