//! GELU (erf form) over runtime buffers: the CPU path is [`gelu_forward`] / [`gelu_backward`]
//! on the host slices, the NPU path [`super::npu`]. All buffers: [N].

use super::{gelu_backward, gelu_forward, npu};
use crate::cast::Elem;
use crate::device::{backend, Backend};
use crate::error::Result;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// [`gelu_forward`] on `stream`'s device: `y = gelu(x)`.
pub fn forward<E: Elem + cannon_runtime::Element>(
    stream: &Stream,
    y: &mut BufferViewMut<'_, E>,
    x: &BufferView<'_, E>,
) -> Result<()> {
    match backend("gelu_forward", stream, &[y.device(), x.device()])? {
        Backend::Cpu => gelu_forward(y.as_host_slice_mut()?, x.as_host_slice()?),
        Backend::Npu(ordinal) => npu::forward(ordinal, stream, y, x),
    }
}

/// [`gelu_backward`] on `stream`'s device: `dx += dy * gelu'(x)`.
pub fn backward<E: Elem + cannon_runtime::Element>(
    stream: &Stream,
    dx: &mut BufferViewMut<'_, E>,
    dy: &BufferView<'_, E>,
    x: &BufferView<'_, E>,
) -> Result<()> {
    let devices = [dx.device(), dy.device(), x.device()];
    match backend("gelu_backward", stream, &devices)? {
        Backend::Cpu => gelu_backward(
            dx.as_host_slice_mut()?,
            dy.as_host_slice()?,
            x.as_host_slice()?,
        ),
        Backend::Npu(ordinal) => npu::backward(ordinal, stream, dx, dy, x),
    }
}
