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
//! bf16 variants: f32 operands are rounded to bf16 with aclnnCast first (the CPU's
//! ties-to-even), products accumulate in f32; the bias is added in f32 and db sums dY's own
//! (unrounded) values, as on the CPU.

use super::device::Grads;
use super::LinearDims;
use crate::device::npu_pending;
use crate::error::Result;
use crate::gemm::Bf16Elem;
use cannon_runtime::{BufferView, BufferViewMut, Stream};
use half::bf16;

/// `Y = aclnnMatmul(X, W^T)` (+ `aclnnInplaceAdd` of b), f32.
pub fn forward(
    ordinal: u32,
    _stream: &Stream,
    _y: &mut BufferViewMut<'_, f32>,
    _x: &BufferView<'_, f32>,
    _w: &BufferView<'_, f32>,
    _b: Option<&BufferView<'_, f32>>,
    _d: LinearDims,
) -> Result<()> {
    Err(npu_pending(
        "linear_forward",
        ordinal,
        "aclnnMatmul (+ aclnnInplaceAdd for the bias)",
    ))
}

/// `dX += dY W`, `dW += dY^T X`, `db += ones^T dY`: aclnnMatmul + aclnnInplaceAdd, f32.
pub fn backward(
    ordinal: u32,
    _stream: &Stream,
    _g: Grads<'_>,
    _dy: &BufferView<'_, f32>,
    _x: &BufferView<'_, f32>,
    _w: &BufferView<'_, f32>,
    _d: LinearDims,
) -> Result<()> {
    Err(npu_pending(
        "linear_backward",
        ordinal,
        "aclnnMatmul + aclnnInplaceAdd",
    ))
}

/// As [`forward`] on bf16 operands, f32 Y.
pub fn forward_bf16<
    X: Bf16Elem + cannon_runtime::Element,
    W: Bf16Elem + cannon_runtime::Element,
>(
    ordinal: u32,
    _stream: &Stream,
    _y: &mut BufferViewMut<'_, f32>,
    _x: &BufferView<'_, X>,
    _w: &BufferView<'_, W>,
    _b: Option<&BufferView<'_, W>>,
    _d: LinearDims,
) -> Result<()> {
    Err(npu_pending(
        "linear_forward_bf16",
        ordinal,
        "aclnnMatmul (bf16, + aclnnCast, aclnnInplaceAdd for the bias)",
    ))
}

/// As [`forward`] on bf16 operands, Y rounded to bf16 (aclnnCast of the f32 result, the
/// CPU's single rounding).
pub fn forward_bf16_to_bf16<
    X: Bf16Elem + cannon_runtime::Element,
    W: Bf16Elem + cannon_runtime::Element,
>(
    ordinal: u32,
    _stream: &Stream,
    _y: &mut BufferViewMut<'_, bf16>,
    _x: &BufferView<'_, X>,
    _w: &BufferView<'_, W>,
    _b: Option<&BufferView<'_, W>>,
    _d: LinearDims,
) -> Result<()> {
    Err(npu_pending(
        "linear_forward_bf16",
        ordinal,
        "aclnnMatmul (bf16) + aclnnCast to bf16",
    ))
}

/// As [`backward`] on bf16 operands, f32 gradients.
pub fn backward_bf16<
    G: Bf16Elem + cannon_runtime::Element,
    X: Bf16Elem + cannon_runtime::Element,
    W: Bf16Elem + cannon_runtime::Element,
>(
    ordinal: u32,
    _stream: &Stream,
    _g: Grads<'_>,
    _dy: &BufferView<'_, G>,
    _x: &BufferView<'_, X>,
    _w: &BufferView<'_, W>,
    _d: LinearDims,
) -> Result<()> {
    Err(npu_pending(
        "linear_backward_bf16",
        ordinal,
        "aclnnMatmul (bf16) + aclnnInplaceAdd",
    ))
}
