//! Elementwise ops over runtime buffers: the CPU path is the slice-level functions on the
//! host slices, the NPU path [`super::npu`]. All buffers: [N].

use super::{add_into, mul, mul_into, npu};
use crate::cast::Elem;
use crate::device::{backend, Backend};
use crate::error::Result;
use bytemuck::Pod;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// [`add_into`] on `stream`'s device: `y += x`.
pub fn add<E: Elem + Pod>(
    stream: &Stream,
    y: &mut BufferViewMut<'_, E>,
    x: &BufferView<'_, E>,
) -> Result<()> {
    match backend("add_into", stream, &[y.device(), x.device()])? {
        Backend::Cpu => add_into(y.as_host_slice_mut()?, x.as_host_slice()?),
        Backend::Npu(ordinal) => npu::add_into(ordinal, stream, y, x),
    }
}

/// [`mul`] on `stream`'s device: `out = a * b`.
pub fn product<E: Elem + Pod>(
    stream: &Stream,
    out: &mut BufferViewMut<'_, E>,
    a: &BufferView<'_, E>,
    b: &BufferView<'_, E>,
) -> Result<()> {
    let devices = [out.device(), a.device(), b.device()];
    match backend("mul", stream, &devices)? {
        Backend::Cpu => mul(
            out.as_host_slice_mut()?,
            a.as_host_slice()?,
            b.as_host_slice()?,
        ),
        Backend::Npu(ordinal) => npu::mul(ordinal, stream, out, a, b),
    }
}

/// [`mul_into`] on `stream`'s device: `y *= x`.
pub fn scale_by<E: Elem + Pod>(
    stream: &Stream,
    y: &mut BufferViewMut<'_, E>,
    x: &BufferView<'_, E>,
) -> Result<()> {
    match backend("mul_into", stream, &[y.device(), x.device()])? {
        Backend::Cpu => mul_into(y.as_host_slice_mut()?, x.as_host_slice()?),
        Backend::Npu(ordinal) => npu::mul_into(ordinal, stream, y, x),
    }
}
