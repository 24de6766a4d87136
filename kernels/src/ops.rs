//! Every op on runtime buffers: the public entry points of the one dispatch point.
//!
//! Each function checks that its operands live on `stream`'s device and runs the op on the
//! backend of that device ([`crate::backend`]): on the CPU the slice-level kernel on the
//! buffers' host slices (bit-identical to calling it directly), on an NPU the op's aclnn
//! body. Shapes, conventions and errors are the slice-level op's; the slice-level function
//! each entry point names documents them.
//!
//! The entry points that run one backend method are generated from the op list
//! (`backend/op_list.rs`), the same list that declares [`crate::backend::Backend`], so an
//! op's signature is written there once; the compositions of several ops follow by hand.

use crate::adamw::AdamW;
use crate::attention::{BlockAttention, QkvBuf, QkvGradBuf, VarlenAttention};
use crate::backend::{define_entry_points, for_each_op};
use crate::cross_entropy::{CeStats, LmHeadGrads, LossNorm};
use crate::error::Result;
use crate::gemm::{Dims, Precision, Trans};
use crate::grad_clip::clip_coefficient;
use crate::index::TransposeDims;
use crate::linear::{LinearDims, LinearGradBufs};
use crate::patch_embed::{PatchEmbedGradBufs, PatchGeom};
use crate::rope::RopeTable;
use cannon_runtime::{BufferView, BufferViewMut, Stream};
use cannon_runtime::{Element, Float};

for_each_op!(define_entry_points);

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
    let norm = crate::grad_clip::host::clip_with_sum_squares::<&mut [f32]>(
        &mut [],
        total_sum_squares,
        max_norm,
    )?;
    if let Some(coef) = clip_coefficient(norm, max_norm) {
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
