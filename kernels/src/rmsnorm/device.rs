//! RMSNorm over runtime buffers: the CPU path is [`rmsnorm_forward`] / [`rmsnorm_backward`] on
//! the buffers' host slices, the NPU path [`super::npu`]. Shapes as in the slice-level API:
//!
//! ```text
//! x, out, dout, dx: [T, D]   weight: [D]   rstd: [T] f32   dweight: [D] f32
//! ```

use super::{npu, rmsnorm_backward, rmsnorm_forward};
use crate::cast::Elem;
use crate::device::{backend, Backend};
use crate::error::Result;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// [`rmsnorm_forward`] on `stream`'s device: `out = rmsnorm(x) * weight`, saving `rstd`.
pub fn forward<E: Elem + cannon_runtime::Element>(
    stream: &Stream,
    out: &mut BufferViewMut<'_, E>,
    rstd: &mut BufferViewMut<'_, f32>,
    x: &BufferView<'_, E>,
    weight: &BufferView<'_, E>,
    dim: usize,
    eps: f32,
) -> Result<()> {
    let devices = [out.device(), rstd.device(), x.device(), weight.device()];
    match backend("rmsnorm_forward", stream, &devices)? {
        Backend::Cpu => rmsnorm_forward(
            out.as_host_slice_mut()?,
            rstd.as_host_slice_mut()?,
            x.as_host_slice()?,
            weight.as_host_slice()?,
            dim,
            eps,
        ),
        Backend::Npu(ordinal) => npu::forward(ordinal, stream, out, rstd, x, weight, dim, eps),
    }
}

/// [`rmsnorm_backward`] on `stream`'s device: accumulates `dx` and `dweight`.
#[allow(clippy::too_many_arguments)]
pub fn backward<E: Elem + cannon_runtime::Element>(
    stream: &Stream,
    dx: &mut BufferViewMut<'_, E>,
    dweight: &mut BufferViewMut<'_, f32>,
    dout: &BufferView<'_, E>,
    x: &BufferView<'_, E>,
    weight: &BufferView<'_, E>,
    rstd: &BufferView<'_, f32>,
    dim: usize,
) -> Result<()> {
    let devices = [
        dx.device(),
        dweight.device(),
        dout.device(),
        x.device(),
        weight.device(),
        rstd.device(),
    ];
    match backend("rmsnorm_backward", stream, &devices)? {
        Backend::Cpu => rmsnorm_backward(
            dx.as_host_slice_mut()?,
            dweight.as_host_slice_mut()?,
            dout.as_host_slice()?,
            x.as_host_slice()?,
            weight.as_host_slice()?,
            rstd.as_host_slice()?,
            dim,
        ),
        Backend::Npu(ordinal) => {
            npu::backward(ordinal, stream, dx, dweight, dout, x, weight, rstd, dim)
        }
    }
}
