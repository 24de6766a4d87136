//! RMSNorm's NPU entry points (bodies land with the NPU issue; until then they return
//! [`npu_pending`]: `NotCompiled` without `--features npu`, `Unsupported` with it).
//!
//! Numerics to check when the bodies land: for bf16 the CPU kernel rounds the normalised row
//! to bf16 before multiplying by the weight (transformers' order); aclnnRmsNorm's rounding
//! order must be compared against the same fixtures.

use crate::backend::npu_pending;
use crate::error::Result;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// `aclnnRmsNorm(x [T, D], gamma = weight [D], epsilon = eps, yOut = out, rstdOut = rstd)`,
/// rstd viewed as `[T, 1]` f32.
#[allow(clippy::too_many_arguments)]
pub fn forward<E: Float>(
    ordinal: u32,
    _stream: &Stream,
    _out: &mut BufferViewMut<'_, E>,
    _rstd: &mut BufferViewMut<'_, f32>,
    _x: &BufferView<'_, E>,
    _weight: &BufferView<'_, E>,
    _dim: usize,
    _eps: f32,
) -> Result<()> {
    Err(npu_pending("rmsnorm_forward", ordinal, "aclnnRmsNorm"))
}

/// `aclnnRmsNormGrad(dy = dout, x, rstd, gamma = weight, dxOut, dgammaOut)` into scratch
/// `[T, D]` / `[D]` f32 buffers (the op writes), then `aclnnInplaceAdd` of each into `dx` and
/// `dweight` (our backward accumulates).
#[allow(clippy::too_many_arguments)]
pub fn backward<E: Float>(
    ordinal: u32,
    _stream: &Stream,
    _dx: &mut BufferViewMut<'_, E>,
    _dweight: &mut BufferViewMut<'_, f32>,
    _dout: &BufferView<'_, E>,
    _x: &BufferView<'_, E>,
    _weight: &BufferView<'_, E>,
    _rstd: &BufferView<'_, f32>,
    _dim: usize,
) -> Result<()> {
    Err(npu_pending(
        "rmsnorm_backward",
        ordinal,
        "aclnnRmsNormGrad + aclnnInplaceAdd",
    ))
}
