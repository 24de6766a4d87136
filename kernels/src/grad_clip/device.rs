//! Global-norm clipping over runtime buffers: the CPU path is the slice-level functions on
//! the host slices, the NPU path [`super::npu`] (sum of squares and scaling; the norm and the
//! coefficient are host scalars either way).
//!
//! ```text
//! grads: any number of [N_i] f32 views (one per tensor or flat shard)
//! ```

use super::{clip_coefficient, npu};
use crate::device::{backend, Backend};
use crate::error::Result;
use cannon_runtime::{BufferView, BufferViewMut, Device, Stream};

/// [`super::grad_sum_squares`] on `stream`'s device: sum of squares of every element, f64.
pub fn grad_sum_squares(stream: &Stream, grads: &[BufferView<'_, f32>]) -> Result<f64> {
    let devices = grads.iter().map(|g| g.device()).collect::<Vec<Device>>();
    match backend("grad_sum_squares", stream, &devices)? {
        Backend::Cpu => {
            let slices = grads
                .iter()
                .map(|g| g.as_host_slice())
                .collect::<cannon_runtime::Result<Vec<&[f32]>>>()?;
            Ok(super::grad_sum_squares(&slices))
        }
        Backend::Npu(ordinal) => npu::grad_sum_squares(ordinal, stream, grads),
    }
}

/// [`super::scale_grads`] on `stream`'s device: every element times `coef`.
pub fn scale_grads(stream: &Stream, grads: &mut [BufferViewMut<'_, f32>], coef: f32) -> Result<()> {
    let devices = grads.iter().map(|g| g.device()).collect::<Vec<Device>>();
    match backend("scale_grads", stream, &devices)? {
        Backend::Cpu => {
            let mut slices = host_slices_mut(grads)?;
            super::scale_grads(&mut slices, coef);
            Ok(())
        }
        Backend::Npu(ordinal) => npu::scale_grads(ordinal, stream, grads, coef),
    }
}

/// [`super::clip_with_sum_squares`] on `stream`'s device; returns the pre-clip norm.
pub fn clip_with_sum_squares(
    stream: &Stream,
    grads: &mut [BufferViewMut<'_, f32>],
    total_sum_squares: f64,
    max_norm: f64,
) -> Result<f64> {
    let devices = grads.iter().map(|g| g.device()).collect::<Vec<Device>>();
    match backend("clip_grad_norm", stream, &devices)? {
        Backend::Cpu => {
            let mut slices = host_slices_mut(grads)?;
            super::clip_with_sum_squares(&mut slices, total_sum_squares, max_norm)
        }
        Backend::Npu(_) => {
            // The slice-level call on no slices validates max_norm and forms the norm with
            // the same code; the scaling itself is the NPU's.
            let norm =
                super::clip_with_sum_squares::<&mut [f32]>(&mut [], total_sum_squares, max_norm)?;
            if let Some(coef) = clip_coefficient(norm, max_norm) {
                // torch multiplies by the coefficient in the gradients' dtype (f32).
                scale_grads(stream, grads, coef as f32)?;
            }
            Ok(norm)
        }
    }
}

/// [`super::clip_grad_norm`] on `stream`'s device (one process); returns the pre-clip norm.
pub fn clip_grad_norm(
    stream: &Stream,
    grads: &mut [BufferViewMut<'_, f32>],
    max_norm: f64,
) -> Result<f64> {
    let devices = grads.iter().map(|g| g.device()).collect::<Vec<Device>>();
    match backend("clip_grad_norm", stream, &devices)? {
        Backend::Cpu => {
            let mut slices = host_slices_mut(grads)?;
            super::clip_grad_norm(&mut slices, max_norm)
        }
        Backend::Npu(_) => {
            let views: Vec<BufferView<'_, f32>> = grads.iter().map(|g| g.as_view()).collect();
            let ss = grad_sum_squares(stream, &views)?;
            clip_with_sum_squares(stream, grads, ss, max_norm)
        }
    }
}

fn host_slices_mut<'a>(grads: &'a mut [BufferViewMut<'_, f32>]) -> Result<Vec<&'a mut [f32]>> {
    Ok(grads
        .iter_mut()
        .map(|g| g.as_host_slice_mut())
        .collect::<cannon_runtime::Result<Vec<_>>>()?)
}
