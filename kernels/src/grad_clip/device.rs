//! Gradient clipping on runtime buffers: the device-level entry points
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
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// [`crate::grad_clip::host::grad_sum_squares`] on `stream`'s device:
/// Sum of squares of every element of every view, in f64 ([`crate::grad_clip`]).
pub fn grad_sum_squares(stream: &Stream, grads: &[BufferView<'_, f32>]) -> Result<f64> {
    let _span = trace::span_on(stream, "grad_sum_squares", trace::Cat::Optimizer);
    match backend::select("grad_sum_squares", stream, &[&grads])? {
        Selected::Cpu(_) => on_cpu::grad_sum_squares(grads),
        Selected::Npu(Npu { ordinal }) => npu::grad_sum_squares(ordinal, stream, grads),
        Selected::Meta(_) => Ok(0.0),
    }
}

/// [`crate::grad_clip::host::scale_grads`] on `stream`'s device:
/// Every element of every view times `coef`.
pub fn scale_grads(stream: &Stream, grads: &mut [BufferViewMut<'_, f32>], coef: f32) -> Result<()> {
    let _span = trace::span_on(stream, "scale_grads", trace::Cat::Optimizer);
    match backend::select("scale_grads", stream, &[&grads])? {
        Selected::Cpu(_) => on_cpu::scale_grads(grads, coef),
        Selected::Npu(Npu { ordinal }) => npu::scale_grads(ordinal, stream, grads, coef),
        Selected::Meta(_) => Ok(()),
    }
}

/// [`crate::grad_clip::host::clip_with_sum_squares`] on `stream`'s device: given the sum of
/// squares of every gradient (summed across ranks by the caller), scales `grads` by
/// `max_norm / (norm + 1e-6)` when that is below 1; returns the pre-clip norm.
pub fn clip_with_sum_squares(
    stream: &Stream,
    grads: &mut [BufferViewMut<'_, f32>],
    total_sum_squares: f64,
    max_norm: f64,
) -> Result<f64> {
    // The slice-level call on no slices validates max_norm and forms the norm with the same
    // code on every backend; the scaling is the backend's.
    let norm =
        super::host::clip_with_sum_squares::<&mut [f32]>(&mut [], total_sum_squares, max_norm)?;
    if let Some(coef) = super::clip_coefficient(norm, max_norm) {
        // torch multiplies by the coefficient in the gradients' dtype (f32).
        scale_grads(stream, grads, coef as f32)?;
    }
    Ok(norm)
}

/// [`crate::grad_clip::host::clip_grad_norm`] on `stream`'s device (one process): the global
/// L2 norm of `grads`, which are scaled in place when it exceeds `max_norm`.
pub fn clip_grad_norm(
    stream: &Stream,
    grads: &mut [BufferViewMut<'_, f32>],
    max_norm: f64,
) -> Result<f64> {
    let views: Vec<BufferView<'_, f32>> = grads.iter().map(|g| g.as_view()).collect();
    let ss = grad_sum_squares(stream, &views)?;
    drop(views);
    clip_with_sum_squares(stream, grads, ss, max_norm)
}

/// The CPU arm of each entry point: the buffers' host slices passed to the slice-level
/// function, without the entry's check or device selection (the slice-level function checks
/// by itself; tests compare the two).
pub mod on_cpu {
    use super::*;
    use crate::grad_clip::host;

    /// The host slices of `views`, for the slice-level functions over several buffers.
    fn host_slices_mut<'a>(views: &'a mut [BufferViewMut<'_, f32>]) -> Result<Vec<&'a mut [f32]>> {
        Ok(views
            .iter_mut()
            .map(|g| g.as_host_slice_mut())
            .collect::<cannon_runtime::Result<Vec<_>>>()?)
    }

    pub fn grad_sum_squares(grads: &[BufferView<'_, f32>]) -> Result<f64> {
        let slices = grads
            .iter()
            .map(|g| g.as_host_slice())
            .collect::<cannon_runtime::Result<Vec<&[f32]>>>()?;
        Ok(host::grad_sum_squares(&slices))
    }

    pub fn scale_grads(grads: &mut [BufferViewMut<'_, f32>], coef: f32) -> Result<()> {
        host::scale_grads(&mut host_slices_mut(grads)?, coef);
        Ok(())
    }
}
