//! SwiGLU's gate activation over runtime buffers: the CPU path is [`swiglu_forward`] /
//! [`swiglu_backward`] on the host slices, the NPU path [`super::npu`]. All buffers: [N].

use super::{npu, swiglu_backward, swiglu_forward};
use crate::cast::Elem;
use crate::device::{backend, Backend};
use crate::error::Result;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// [`swiglu_forward`] on `stream`'s device: `h = silu(gate) * up`.
pub fn forward<E: Elem + cannon_runtime::Element>(
    stream: &Stream,
    h: &mut BufferViewMut<'_, E>,
    gate: &BufferView<'_, E>,
    up: &BufferView<'_, E>,
) -> Result<()> {
    let devices = [h.device(), gate.device(), up.device()];
    match backend("swiglu_forward", stream, &devices)? {
        Backend::Cpu => swiglu_forward(
            h.as_host_slice_mut()?,
            gate.as_host_slice()?,
            up.as_host_slice()?,
        ),
        Backend::Npu(ordinal) => npu::forward(ordinal, stream, h, gate, up),
    }
}

/// [`swiglu_backward`] on `stream`'s device: accumulates `d_gate` and `d_up`.
pub fn backward<E: Elem + cannon_runtime::Element>(
    stream: &Stream,
    d_gate: &mut BufferViewMut<'_, E>,
    d_up: &mut BufferViewMut<'_, E>,
    dh: &BufferView<'_, E>,
    gate: &BufferView<'_, E>,
    up: &BufferView<'_, E>,
) -> Result<()> {
    let devices = [
        d_gate.device(),
        d_up.device(),
        dh.device(),
        gate.device(),
        up.device(),
    ];
    match backend("swiglu_backward", stream, &devices)? {
        Backend::Cpu => swiglu_backward(
            d_gate.as_host_slice_mut()?,
            d_up.as_host_slice_mut()?,
            dh.as_host_slice()?,
            gate.as_host_slice()?,
            up.as_host_slice()?,
        ),
        Backend::Npu(ordinal) => npu::backward(ordinal, stream, d_gate, d_up, dh, gate, up),
    }
}
