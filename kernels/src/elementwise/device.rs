//! The elementwise ops on runtime buffers: the device-level entry points
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

/// [`crate::elementwise::host::add_into`] on `stream`'s device:
/// `y += x` ([`crate::elementwise`]).
pub fn add_into<E: Float>(
    stream: &Stream,
    y: &mut BufferViewMut<'_, E>,
    x: &BufferView<'_, E>,
) -> Result<()> {
    super::check_add_into(y.len(), x.len())?;
    let _span = trace::span_on(stream, "add_into", trace::Cat::Norm);
    match backend::select("add_into", stream, &[&y, &x])? {
        Selected::Cpu(_) => on_cpu::add_into(y, x),
        Selected::Npu(Npu { ordinal }) => npu::add_into(ordinal, stream, y, x),
        Selected::Meta(_) => Ok(()),
    }
}

/// [`crate::elementwise::host::mul`] on `stream`'s device:
/// `out = a * b`.
pub fn mul<E: Float>(
    stream: &Stream,
    out: &mut BufferViewMut<'_, E>,
    a: &BufferView<'_, E>,
    b: &BufferView<'_, E>,
) -> Result<()> {
    super::check_mul(out.len(), a.len(), b.len())?;
    let _span = trace::span_on(stream, "mul", trace::Cat::Norm);
    match backend::select("mul", stream, &[&out, &a, &b])? {
        Selected::Cpu(_) => on_cpu::mul(out, a, b),
        Selected::Npu(Npu { ordinal }) => npu::mul(ordinal, stream, out, a, b),
        Selected::Meta(_) => Ok(()),
    }
}

/// [`crate::elementwise::host::mul_into`] on `stream`'s device:
/// `y *= x`.
pub fn mul_into<E: Float>(
    stream: &Stream,
    y: &mut BufferViewMut<'_, E>,
    x: &BufferView<'_, E>,
) -> Result<()> {
    super::check_mul_into(y.len(), x.len())?;
    let _span = trace::span_on(stream, "mul_into", trace::Cat::Norm);
    match backend::select("mul_into", stream, &[&y, &x])? {
        Selected::Cpu(_) => on_cpu::mul_into(y, x),
        Selected::Npu(Npu { ordinal }) => npu::mul_into(ordinal, stream, y, x),
        Selected::Meta(_) => Ok(()),
    }
}

/// The CPU arm of each entry point: the buffers' host slices passed to the slice-level
/// function, without the entry's check or device selection (the slice-level function checks
/// by itself; tests compare the two).
pub mod on_cpu {
    use super::*;
    use crate::elementwise::host;

    pub fn add_into<E: Float>(y: &mut BufferViewMut<'_, E>, x: &BufferView<'_, E>) -> Result<()> {
        host::add_into(y.as_host_slice_mut()?, x.as_host_slice()?)
    }

    pub fn mul<E: Float>(
        out: &mut BufferViewMut<'_, E>,
        a: &BufferView<'_, E>,
        b: &BufferView<'_, E>,
    ) -> Result<()> {
        host::mul(
            out.as_host_slice_mut()?,
            a.as_host_slice()?,
            b.as_host_slice()?,
        )
    }

    pub fn mul_into<E: Float>(y: &mut BufferViewMut<'_, E>, x: &BufferView<'_, E>) -> Result<()> {
        host::mul_into(y.as_host_slice_mut()?, x.as_host_slice()?)
    }
}
