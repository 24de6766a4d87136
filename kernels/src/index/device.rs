//! Row gathers/scatters and the transpose over runtime buffers: the CPU path is the
//! slice-level functions on the host slices, the NPU path [`super::npu`]. The row indices
//! are a host slice (checked there; the NPU path uploads them).
//!
//! ```text
//! gather_rows: out [K, D], src [R, D]   scatter_rows / scatter_add_rows: dst [R, D], src [K, D]
//! zero_rows: dst [R, D]                 transpose: x [B, R, C] -> out [B, C, R]
//! ```

use super::{
    gather_rows, npu, scatter_add_rows, scatter_rows, transpose, zero_rows, TransposeDims,
};
use crate::cast::Elem;
use crate::device::{backend, Backend};
use crate::error::Result;
use bytemuck::Pod;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// [`gather_rows`] on `stream`'s device: `out[i] = src[idx[i]]`.
pub fn gather<T: Pod + Send + Sync>(
    stream: &Stream,
    out: &mut BufferViewMut<'_, T>,
    src: &BufferView<'_, T>,
    idx: &[usize],
    dim: usize,
) -> Result<()> {
    match backend("gather_rows", stream, &[out.device(), src.device()])? {
        Backend::Cpu => gather_rows(out.as_host_slice_mut()?, src.as_host_slice()?, idx, dim),
        Backend::Npu(ordinal) => npu::gather_rows(ordinal, stream, out, src, idx, dim),
    }
}

/// [`scatter_rows`] on `stream`'s device: `dst[idx[i]] = src[i]`.
pub fn scatter<T: Pod>(
    stream: &Stream,
    dst: &mut BufferViewMut<'_, T>,
    src: &BufferView<'_, T>,
    idx: &[usize],
    dim: usize,
) -> Result<()> {
    match backend("scatter_rows", stream, &[dst.device(), src.device()])? {
        Backend::Cpu => scatter_rows(dst.as_host_slice_mut()?, src.as_host_slice()?, idx, dim),
        Backend::Npu(ordinal) => npu::scatter_rows(ordinal, stream, dst, src, idx, dim),
    }
}

/// [`scatter_add_rows`] on `stream`'s device: `dst[idx[i]] += src[i]`.
pub fn scatter_add<E: Elem + Pod>(
    stream: &Stream,
    dst: &mut BufferViewMut<'_, E>,
    src: &BufferView<'_, E>,
    idx: &[usize],
    dim: usize,
) -> Result<()> {
    match backend("scatter_add_rows", stream, &[dst.device(), src.device()])? {
        Backend::Cpu => scatter_add_rows(dst.as_host_slice_mut()?, src.as_host_slice()?, idx, dim),
        Backend::Npu(ordinal) => npu::scatter_add_rows(ordinal, stream, dst, src, idx, dim),
    }
}

/// [`zero_rows`] on `stream`'s device: `dst[idx[i]] = 0`.
pub fn zero<T: Pod>(
    stream: &Stream,
    dst: &mut BufferViewMut<'_, T>,
    idx: &[usize],
    dim: usize,
) -> Result<()> {
    match backend("zero_rows", stream, &[dst.device()])? {
        Backend::Cpu => zero_rows(dst.as_host_slice_mut()?, idx, dim),
        Backend::Npu(ordinal) => npu::zero_rows(ordinal, stream, dst, idx, dim),
    }
}

/// [`transpose`] on `stream`'s device: `out[b, c, r] = x[b, r, c]`.
pub fn transposed<T: Pod + Send + Sync>(
    stream: &Stream,
    out: &mut BufferViewMut<'_, T>,
    x: &BufferView<'_, T>,
    d: TransposeDims,
) -> Result<()> {
    match backend("transpose", stream, &[out.device(), x.device()])? {
        Backend::Cpu => transpose(out.as_host_slice_mut()?, x.as_host_slice()?, d),
        Backend::Npu(ordinal) => npu::transpose(ordinal, stream, out, x, d),
    }
}
