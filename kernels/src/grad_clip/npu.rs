//! Clipping's NPU entry points (bodies land with the NPU issue; until then they return
//! [`npu_pending`]: `NotCompiled` without `--features npu`, `Unsupported` with it).
//!
//! aclnn has no global-norm op among our bindings, so clipping is the documented composition
//! of a sum of squares per view and a scaling by a host scalar; the norm, the coefficient and
//! the cross-rank all-reduce of the sum stay on the host exactly as in the CPU path.

use crate::backend::npu_pending;
use crate::error::Result;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// Per view, the dot product of the view with itself as one `aclnnMatmul` of its `[1, N]`
/// and `[N, 1]` views into a 1-element f32 scratch (f32 accumulation on the cube unit, where
/// the CPU accumulates in f64: the NPU issue states that tolerance), copied to the host and
/// summed in f64 in view order.
pub fn grad_sum_squares(
    ordinal: u32,
    _stream: &Stream,
    _grads: &[BufferView<'_, f32>],
) -> Result<f64> {
    Err(npu_pending(
        "grad_sum_squares",
        ordinal,
        "aclnnMatmul (sum of squares as g^T g)",
    ))
}

/// `aclnnInplaceMuls(g, coef)` on every view.
pub fn scale_grads(
    ordinal: u32,
    _stream: &Stream,
    _grads: &mut [BufferViewMut<'_, f32>],
    _coef: f32,
) -> Result<()> {
    Err(npu_pending("scale_grads", ordinal, "aclnnInplaceMuls"))
}
