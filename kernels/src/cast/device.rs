//! Casts over runtime buffers: the CPU path is [`cast_f32_to_bf16`] / [`cast_bf16_to_f32`] /
//! [`cast`] on the host slices, the NPU path [`super::npu`]. src, dst: [N].

use super::{cast, cast_bf16_to_f32, cast_f32_to_bf16, npu, Elem};
use crate::device::{backend, Backend};
use crate::error::Result;
use cannon_runtime::{BufferView, BufferViewMut, Stream};
use half::bf16;

/// [`cast_f32_to_bf16`] on `stream`'s device (round to nearest, ties to even).
pub fn f32_to_bf16(
    stream: &Stream,
    src: &BufferView<'_, f32>,
    dst: &mut BufferViewMut<'_, bf16>,
) -> Result<()> {
    match backend("cast_f32_to_bf16", stream, &[src.device(), dst.device()])? {
        Backend::Cpu => cast_f32_to_bf16(src.as_host_slice()?, dst.as_host_slice_mut()?),
        Backend::Npu(ordinal) => npu::f32_to_bf16(ordinal, stream, src, dst),
    }
}

/// [`cast_bf16_to_f32`] on `stream`'s device (exact).
pub fn bf16_to_f32(
    stream: &Stream,
    src: &BufferView<'_, bf16>,
    dst: &mut BufferViewMut<'_, f32>,
) -> Result<()> {
    match backend("cast_bf16_to_f32", stream, &[src.device(), dst.device()])? {
        Backend::Cpu => cast_bf16_to_f32(src.as_host_slice()?, dst.as_host_slice_mut()?),
        Backend::Npu(ordinal) => npu::bf16_to_f32(ordinal, stream, src, dst),
    }
}

/// [`cast`] between any two storage types on `stream`'s device.
pub fn convert<A: Elem + cannon_runtime::Element, B: Elem + cannon_runtime::Element>(
    stream: &Stream,
    src: &BufferView<'_, A>,
    dst: &mut BufferViewMut<'_, B>,
) -> Result<()> {
    match backend("cast", stream, &[src.device(), dst.device()])? {
        Backend::Cpu => cast(src.as_host_slice()?, dst.as_host_slice_mut()?),
        Backend::Npu(ordinal) => npu::convert(ordinal, stream, src, dst),
    }
}
