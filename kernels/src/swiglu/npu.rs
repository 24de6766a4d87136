//! SwiGLU's NPU entry points (bodies land with the NPU issue; until then they return
//! [`npu_pending`]: `NotCompiled` without `--features npu`, `Unsupported` with it).
//!
//! aclnnSwiGlu takes gate and up as the two halves of one tensor along `dim`. Our gate and up
//! are separate `[N]` views: when `up` directly follows `gate` in one buffer they are the
//! `[2, N]` tensor with `dim = 0` as they stand; otherwise the body copies them into a
//! `[2, N]` scratch first. For bf16 the CPU kernel rounds silu(gate) to bf16 before the
//! product (transformers' order); aclnnSwiGlu's rounding must be checked against it.

use crate::backend::npu_pending;
use crate::error::Result;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// `aclnnSwiGlu(x = [gate; up] as [2, N], dim = 0, out = h)`.
pub fn forward<E: Float>(
    ordinal: u32,
    _stream: &Stream,
    _h: &mut BufferViewMut<'_, E>,
    _gate: &BufferView<'_, E>,
    _up: &BufferView<'_, E>,
) -> Result<()> {
    Err(npu_pending("swiglu_forward", ordinal, "aclnnSwiGlu"))
}

/// `aclnnSwiGluGrad(yGrad = dh, x = [gate; up], dim = 0, out)` into a `[2, N]` scratch (the
/// op writes), then `aclnnInplaceAdd` of its halves into `d_gate` and `d_up`.
pub fn backward<E: Float>(
    ordinal: u32,
    _stream: &Stream,
    _d_gate: &mut BufferViewMut<'_, E>,
    _d_up: &mut BufferViewMut<'_, E>,
    _dh: &BufferView<'_, E>,
    _gate: &BufferView<'_, E>,
    _up: &BufferView<'_, E>,
) -> Result<()> {
    Err(npu_pending(
        "swiglu_backward",
        ordinal,
        "aclnnSwiGluGrad + aclnnInplaceAdd",
    ))
}
