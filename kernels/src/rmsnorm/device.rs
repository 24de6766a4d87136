//! RMSNorm on runtime buffers: the device-level entry points
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

/// [`crate::rmsnorm::host::rmsnorm_forward`] on `stream`'s device:
/// `out = rmsnorm(x) * weight`, saving `rstd` ([`crate::rmsnorm`]).
pub fn rmsnorm_forward<E: Float>(
    stream: &Stream,
    out: &mut BufferViewMut<'_, E>,
    rstd: &mut BufferViewMut<'_, f32>,
    x: &BufferView<'_, E>,
    weight: &BufferView<'_, E>,
    dim: usize,
    eps: f32,
) -> Result<()> {
    super::check_forward(out.len(), rstd.len(), x.len(), weight.len(), dim)?;
    let _span = trace::span_on(stream, "rmsnorm_forward", trace::Cat::Norm);
    match backend::select("rmsnorm_forward", stream, &[&out, &rstd, &x, &weight])? {
        Selected::Cpu(_) => on_cpu::rmsnorm_forward(out, rstd, x, weight, dim, eps),
        Selected::Npu(Npu { ordinal }) => {
            npu::forward(ordinal, stream, out, rstd, x, weight, dim, eps)
        }
        Selected::Meta(_) => Ok(()),
    }
}

/// [`crate::rmsnorm::host::rmsnorm_backward`] on `stream`'s device:
/// Accumulates `dx` and `dweight`.
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_backward<E: Float>(
    stream: &Stream,
    dx: &mut BufferViewMut<'_, E>,
    dweight: &mut BufferViewMut<'_, f32>,
    dout: &BufferView<'_, E>,
    x: &BufferView<'_, E>,
    weight: &BufferView<'_, E>,
    rstd: &BufferView<'_, f32>,
    dim: usize,
) -> Result<()> {
    let (dxl, dwl, dl) = (dx.len(), dweight.len(), dout.len());
    let (xl, wl, rl) = (x.len(), weight.len(), rstd.len());
    super::check_backward(dxl, dwl, dl, xl, wl, rl, dim)?;
    let _span = trace::span_on(stream, "rmsnorm_backward", trace::Cat::Norm);
    match backend::select(
        "rmsnorm_backward",
        stream,
        &[&dx, &dweight, &dout, &x, &weight, &rstd],
    )? {
        Selected::Cpu(_) => on_cpu::rmsnorm_backward(dx, dweight, dout, x, weight, rstd, dim),
        Selected::Npu(Npu { ordinal }) => {
            npu::backward(ordinal, stream, dx, dweight, dout, x, weight, rstd, dim)
        }
        Selected::Meta(_) => Ok(()),
    }
}

/// The CPU arm of each entry point: the buffers' host slices passed to the slice-level
/// function, without the entry's check or device selection (the slice-level function checks
/// by itself; tests compare the two).
pub mod on_cpu {
    use super::*;
    use crate::rmsnorm::host;

    pub fn rmsnorm_forward<E: Float>(
        out: &mut BufferViewMut<'_, E>,
        rstd: &mut BufferViewMut<'_, f32>,
        x: &BufferView<'_, E>,
        weight: &BufferView<'_, E>,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        host::rmsnorm_forward(
            out.as_host_slice_mut()?,
            rstd.as_host_slice_mut()?,
            x.as_host_slice()?,
            weight.as_host_slice()?,
            dim,
            eps,
        )
    }

    pub fn rmsnorm_backward<E: Float>(
        dx: &mut BufferViewMut<'_, E>,
        dweight: &mut BufferViewMut<'_, f32>,
        dout: &BufferView<'_, E>,
        x: &BufferView<'_, E>,
        weight: &BufferView<'_, E>,
        rstd: &BufferView<'_, f32>,
        dim: usize,
    ) -> Result<()> {
        host::rmsnorm_backward(
            dx.as_host_slice_mut()?,
            dweight.as_host_slice_mut()?,
            dout.as_host_slice()?,
            x.as_host_slice()?,
            weight.as_host_slice()?,
            rstd.as_host_slice()?,
            dim,
        )
    }
}
