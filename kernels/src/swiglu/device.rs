//! SwiGLU on runtime buffers: the device-level entry points
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

/// [`crate::swiglu::host::swiglu_forward`] on `stream`'s device:
/// `h = silu(gate) * up` ([`crate::swiglu`]).
pub fn swiglu_forward<E: Float>(
    stream: &Stream,
    h: &mut BufferViewMut<'_, E>,
    gate: &BufferView<'_, E>,
    up: &BufferView<'_, E>,
) -> Result<()> {
    super::check_forward(h.len(), gate.len(), up.len())?;
    let _span = trace::span_on(stream, "swiglu_forward", trace::Cat::Norm);
    match backend::select("swiglu_forward", stream, &[&h, &gate, &up])? {
        Selected::Cpu(_) => on_cpu::swiglu_forward(h, gate, up),
        Selected::Npu(Npu { ordinal }) => npu::forward(ordinal, stream, h, gate, up),
        Selected::Meta(_) => Ok(()),
    }
}

/// [`crate::swiglu::host::swiglu_backward`] on `stream`'s device:
/// Accumulates `d_gate` and `d_up`.
pub fn swiglu_backward<E: Float>(
    stream: &Stream,
    d_gate: &mut BufferViewMut<'_, E>,
    d_up: &mut BufferViewMut<'_, E>,
    dh: &BufferView<'_, E>,
    gate: &BufferView<'_, E>,
    up: &BufferView<'_, E>,
) -> Result<()> {
    let (dg, du, dhl) = (d_gate.len(), d_up.len(), dh.len());
    super::check_backward(dg, du, dhl, gate.len(), up.len())?;
    let _span = trace::span_on(stream, "swiglu_backward", trace::Cat::Norm);
    match backend::select(
        "swiglu_backward",
        stream,
        &[&d_gate, &d_up, &dh, &gate, &up],
    )? {
        Selected::Cpu(_) => on_cpu::swiglu_backward(d_gate, d_up, dh, gate, up),
        Selected::Npu(Npu { ordinal }) => {
            npu::backward(ordinal, stream, d_gate, d_up, dh, gate, up)
        }
        Selected::Meta(_) => Ok(()),
    }
}

/// The CPU arm of each entry point: the buffers' host slices passed to the slice-level
/// function, without the entry's check or device selection (the slice-level function checks
/// by itself; tests compare the two).
pub mod on_cpu {
    use super::*;
    use crate::swiglu::host;

    pub fn swiglu_forward<E: Float>(
        h: &mut BufferViewMut<'_, E>,
        gate: &BufferView<'_, E>,
        up: &BufferView<'_, E>,
    ) -> Result<()> {
        host::swiglu_forward(
            h.as_host_slice_mut()?,
            gate.as_host_slice()?,
            up.as_host_slice()?,
        )
    }

    pub fn swiglu_backward<E: Float>(
        d_gate: &mut BufferViewMut<'_, E>,
        d_up: &mut BufferViewMut<'_, E>,
        dh: &BufferView<'_, E>,
        gate: &BufferView<'_, E>,
        up: &BufferView<'_, E>,
    ) -> Result<()> {
        host::swiglu_backward(
            d_gate.as_host_slice_mut()?,
            d_up.as_host_slice_mut()?,
            dh.as_host_slice()?,
            gate.as_host_slice()?,
            up.as_host_slice()?,
        )
    }
}
