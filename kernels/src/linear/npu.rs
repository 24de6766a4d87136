//! linear's NPU entry points (bodies land with the NPU issue; until then they return
//! [`npu_pending`]: `NotCompiled` without `--features npu`, `Unsupported` with it).
//!
//! Each body is the composition of the three GEMMs of the slice-level module on
//! `gemm::npu` (aclnnMatmul with transposes as strides, accumulation by aclnnInplaceAdd):
//!
//! ```text
//! forward   Y[T,O]   = aclnnMatmul(X, W^T view) (+ aclnnInplaceAdd(Y, b broadcast over T))
//! backward  dX[T,I] += aclnnMatmul(dY, W)
//!           dW[O,I] += aclnnMatmul(dY^T view, X)
//!           db[O]   += aclnnMatmul(ones[1,T], dY)   (the column sum, without a ReduceSum)
//! ```
//!
//! Under `Precision::Bf16`: f32 operands are rounded to bf16 with aclnnCast first (the CPU's
//! ties-to-even), products accumulate in f32; the bias is added in f32 and db sums dY's own
//! (unrounded) values, as on the CPU.

use super::{LinearDims, LinearGradBufs};
use crate::backend::npu_pending;
use crate::error::Result;
use crate::gemm::Precision;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// `Y = aclnnMatmul(X, W^T)` (+ `aclnnInplaceAdd` of b); under `Bf16` f32 operands are cast
/// first and a bf16 Y is the aclnnCast of the f32 result (the CPU's single rounding).
#[allow(clippy::too_many_arguments)]
pub fn forward<Y: Float, X: Float, W: Float>(
    ordinal: u32,
    _stream: &Stream,
    _p: Precision,
    _y: &mut BufferViewMut<'_, Y>,
    _x: &BufferView<'_, X>,
    _w: &BufferView<'_, W>,
    _b: Option<&BufferView<'_, W>>,
    _d: LinearDims,
) -> Result<()> {
    Err(npu_pending(
        "linear_forward",
        ordinal,
        "aclnnMatmul (+ aclnnCast, aclnnInplaceAdd for the bias)",
    ))
}

/// `dX += dY W`, `dW += dY^T X`, `db += ones^T dY`: aclnnMatmul + aclnnInplaceAdd.
#[allow(clippy::too_many_arguments)]
pub fn backward<G: Float, X: Float, W: Float>(
    ordinal: u32,
    _stream: &Stream,
    _p: Precision,
    _g: LinearGradBufs<'_>,
    _dy: &BufferView<'_, G>,
    _x: &BufferView<'_, X>,
    _w: &BufferView<'_, W>,
    _d: LinearDims,
) -> Result<()> {
    Err(npu_pending(
        "linear_backward",
        ordinal,
        "aclnnMatmul + aclnnInplaceAdd",
    ))
}
