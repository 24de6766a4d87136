//! linear on runtime buffers: the device-level entry points
//! (re-exported by [`crate::ops`]).
//!
//! Each runs the op's check (the rule its slice-level function and NPU body apply too, so
//! the meta device rejects what the CPU would), selects the backend once (every operand on
//! the stream's device, [`backend::select`]), and matches on it: the CPU arm
//! ([`on_cpu`]) borrows the buffers' host slices for [`super::host`], the NPU arm is the
//! op's aclnn body (`npu.rs`), the meta arm computes nothing.

use super::npu;
use super::{LinearDims, LinearGradBufs};
use crate::backend::{self, Npu, Selected};
use crate::error::Result;
use crate::gemm::Precision;
use cannon_runtime::trace;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// [`crate::linear::host::linear_forward`] on `stream`'s device:
/// `y = x w^T (+ b)` in precision `p` ([`crate::linear`]).
pub fn linear_forward<Y: Float, X: Float, W: Float>(
    stream: &Stream,
    p: Precision,
    y: &mut BufferViewMut<'_, Y>,
    x: &BufferView<'_, X>,
    w: &BufferView<'_, W>,
    b: Option<&BufferView<'_, W>>,
    d: LinearDims,
) -> Result<()> {
    let bl = b.map(|b| b.len());
    super::check_forward::<Y, X, W>(p, d, y.len(), x.len(), w.len(), bl)?;
    let _span = trace::span_on(stream, "linear_forward", trace::Cat::Gemm);
    match backend::select("linear_forward", stream, &[&y, &x, &w, &b])? {
        Selected::Cpu(_) => on_cpu::linear_forward(p, y, x, w, b, d),
        Selected::Npu(Npu { ordinal }) => npu::forward(ordinal, stream, p, y, x, w, b, d),
        Selected::Meta(_) => Ok(()),
    }
}

/// [`crate::linear::host::linear_backward`] on `stream`'s device:
/// Accumulates the gradients present in `g`, in precision `p`.
pub fn linear_backward<G: Float, X: Float, W: Float>(
    stream: &Stream,
    p: Precision,
    g: LinearGradBufs<'_>,
    dy: &BufferView<'_, G>,
    x: &BufferView<'_, X>,
    w: &BufferView<'_, W>,
    d: LinearDims,
) -> Result<()> {
    let (dyl, xl, wl) = (dy.len(), x.len(), w.len());
    super::check_backward::<G, X, W>(p, d, g.lens(), dyl, xl, wl)?;
    let _span = trace::span_on(stream, "linear_backward", trace::Cat::Gemm);
    match backend::select("linear_backward", stream, &[&g, &dy, &x, &w])? {
        Selected::Cpu(_) => on_cpu::linear_backward(p, g, dy, x, w, d),
        Selected::Npu(Npu { ordinal }) => npu::backward(ordinal, stream, p, g, dy, x, w, d),
        Selected::Meta(_) => Ok(()),
    }
}

/// The CPU arm of each entry point: the buffers' host slices passed to the slice-level
/// function, without the entry's check or device selection (the slice-level function checks
/// by itself; tests compare the two).
pub mod on_cpu {
    use super::*;
    use crate::linear::host;

    pub fn linear_forward<Y: Float, X: Float, W: Float>(
        p: Precision,
        y: &mut BufferViewMut<'_, Y>,
        x: &BufferView<'_, X>,
        w: &BufferView<'_, W>,
        b: Option<&BufferView<'_, W>>,
        d: LinearDims,
    ) -> Result<()> {
        let b = b.map(|b| b.as_host_slice()).transpose()?;
        host::linear_forward(
            p,
            y.as_host_slice_mut()?,
            x.as_host_slice()?,
            w.as_host_slice()?,
            b,
            d,
        )
    }

    pub fn linear_backward<G: Float, X: Float, W: Float>(
        p: Precision,
        mut g: LinearGradBufs<'_>,
        dy: &BufferView<'_, G>,
        x: &BufferView<'_, X>,
        w: &BufferView<'_, W>,
        d: LinearDims,
    ) -> Result<()> {
        let (dy, x, w) = (dy.as_host_slice()?, x.as_host_slice()?, w.as_host_slice()?);
        host::linear_backward(p, g.host()?, dy, x, w, d)
    }
}
