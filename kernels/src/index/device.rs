//! The row-index ops on runtime buffers: the device-level entry points
//! (re-exported by [`crate::ops`]).
//!
//! Each runs the op's check (the rule its slice-level function and NPU body apply too, so
//! the meta device rejects what the CPU would), selects the backend once (every operand on
//! the stream's device, [`backend::select`]), and matches on it: the CPU arm
//! ([`on_cpu`]) borrows the buffers' host slices for [`super::host`], the NPU arm is the
//! op's aclnn body (`npu.rs`), the meta arm computes nothing.

use super::npu;
use super::TransposeDims;
use crate::backend::{self, Npu, Selected};
use crate::error::Result;
use cannon_runtime::trace;
use cannon_runtime::{BufferView, BufferViewMut, Stream};
use cannon_runtime::{Element, Float};

/// [`crate::index::host::gather_rows`] on `stream`'s device:
/// `out[i] = src[idx[i]]`, rows of `dim` ([`crate::index`]).
pub fn gather_rows<T: Element>(
    stream: &Stream,
    out: &mut BufferViewMut<'_, T>,
    src: &BufferView<'_, T>,
    idx: &[usize],
    dim: usize,
) -> Result<()> {
    super::check_gather_rows(out.len(), src.len(), idx, dim)?;
    let _span = trace::span_on(stream, "gather_rows", trace::Cat::Norm);
    match backend::select("gather_rows", stream, &[&out, &src])? {
        Selected::Cpu(_) => on_cpu::gather_rows(out, src, idx, dim),
        Selected::Npu(Npu { ordinal }) => npu::gather_rows(ordinal, stream, out, src, idx, dim),
        Selected::Meta(_) => Ok(()),
    }
}

/// [`crate::index::host::scatter_rows`] on `stream`'s device:
/// `dst[idx[i]] = src[i]`.
pub fn scatter_rows<T: Element>(
    stream: &Stream,
    dst: &mut BufferViewMut<'_, T>,
    src: &BufferView<'_, T>,
    idx: &[usize],
    dim: usize,
) -> Result<()> {
    super::check_scatter_rows("scatter_rows", dst.len(), src.len(), idx, dim)?;
    let _span = trace::span_on(stream, "scatter_rows", trace::Cat::Norm);
    match backend::select("scatter_rows", stream, &[&dst, &src])? {
        Selected::Cpu(_) => on_cpu::scatter_rows(dst, src, idx, dim),
        Selected::Npu(Npu { ordinal }) => npu::scatter_rows(ordinal, stream, dst, src, idx, dim),
        Selected::Meta(_) => Ok(()),
    }
}

/// [`crate::index::host::scatter_add_rows`] on `stream`'s device:
/// `dst[idx[i]] += src[i]`, in order of i.
pub fn scatter_add_rows<E: Float>(
    stream: &Stream,
    dst: &mut BufferViewMut<'_, E>,
    src: &BufferView<'_, E>,
    idx: &[usize],
    dim: usize,
) -> Result<()> {
    let (op, n, m) = ("scatter_add_rows", dst.len(), src.len());
    super::check_scatter_rows(op, n, m, idx, dim)?;
    let _span = trace::span_on(stream, "scatter_add_rows", trace::Cat::Norm);
    match backend::select("scatter_add_rows", stream, &[&dst, &src])? {
        Selected::Cpu(_) => on_cpu::scatter_add_rows(dst, src, idx, dim),
        Selected::Npu(Npu { ordinal }) => {
            npu::scatter_add_rows(ordinal, stream, dst, src, idx, dim)
        }
        Selected::Meta(_) => Ok(()),
    }
}

/// [`crate::index::host::zero_rows`] on `stream`'s device:
/// `dst[idx[i]] = 0`.
pub fn zero_rows<T: Element>(
    stream: &Stream,
    dst: &mut BufferViewMut<'_, T>,
    idx: &[usize],
    dim: usize,
) -> Result<()> {
    super::check_zero_rows(dst.len(), idx, dim)?;
    let _span = trace::span_on(stream, "zero_rows", trace::Cat::Norm);
    match backend::select("zero_rows", stream, &[&dst])? {
        Selected::Cpu(_) => on_cpu::zero_rows(dst, idx, dim),
        Selected::Npu(Npu { ordinal }) => npu::zero_rows(ordinal, stream, dst, idx, dim),
        Selected::Meta(_) => Ok(()),
    }
}

/// [`crate::index::host::transpose`] on `stream`'s device:
/// `out[b, c, r] = x[b, r, c]`.
pub fn transpose<T: Element>(
    stream: &Stream,
    out: &mut BufferViewMut<'_, T>,
    x: &BufferView<'_, T>,
    d: TransposeDims,
) -> Result<()> {
    super::check_transpose(out.len(), x.len(), d)?;
    let _span = trace::span_on(stream, "transpose", trace::Cat::Norm);
    match backend::select("transpose", stream, &[&out, &x])? {
        Selected::Cpu(_) => on_cpu::transpose(out, x, d),
        Selected::Npu(Npu { ordinal }) => npu::transpose(ordinal, stream, out, x, d),
        Selected::Meta(_) => Ok(()),
    }
}

/// The CPU arm of each entry point: the buffers' host slices passed to the slice-level
/// function, without the entry's check or device selection (the slice-level function checks
/// by itself; tests compare the two).
pub mod on_cpu {
    use super::*;
    use crate::index::host;

    pub fn gather_rows<T: Element>(
        out: &mut BufferViewMut<'_, T>,
        src: &BufferView<'_, T>,
        idx: &[usize],
        dim: usize,
    ) -> Result<()> {
        host::gather_rows(out.as_host_slice_mut()?, src.as_host_slice()?, idx, dim)
    }

    pub fn scatter_rows<T: Element>(
        dst: &mut BufferViewMut<'_, T>,
        src: &BufferView<'_, T>,
        idx: &[usize],
        dim: usize,
    ) -> Result<()> {
        host::scatter_rows(dst.as_host_slice_mut()?, src.as_host_slice()?, idx, dim)
    }

    pub fn scatter_add_rows<E: Float>(
        dst: &mut BufferViewMut<'_, E>,
        src: &BufferView<'_, E>,
        idx: &[usize],
        dim: usize,
    ) -> Result<()> {
        host::scatter_add_rows(dst.as_host_slice_mut()?, src.as_host_slice()?, idx, dim)
    }

    pub fn zero_rows<T: Element>(
        dst: &mut BufferViewMut<'_, T>,
        idx: &[usize],
        dim: usize,
    ) -> Result<()> {
        host::zero_rows(dst.as_host_slice_mut()?, idx, dim)
    }

    pub fn transpose<T: Element>(
        out: &mut BufferViewMut<'_, T>,
        x: &BufferView<'_, T>,
        d: TransposeDims,
    ) -> Result<()> {
        host::transpose(out.as_host_slice_mut()?, x.as_host_slice()?, d)
    }
}
