//! GELU's NPU entry points: pending (they return [`npu_pending`]: `NotCompiled` without
//! `--features npu`, `Unsupported` naming the missing aclnn op with it), never a host
//! fallback.
//!
//! CANN 8.x has the exact (erf) GELU as `aclnnGeluV2` / `aclnnGeluBackwardV2` with
//! `approximate = "none"` (V2 names the erf form explicitly rather than leaving it to the
//! op's default); neither is in `sys/src/generated/aclnn.rs` yet: adding them needs the
//! generator run on the CANN headers (sys/README.md). No composition of the bound ops gives
//! erf or exp, so there is none to fall back on; once aclnnErf / aclnnExp are bound the
//! composition is: `Phi = (1 + erf(x / sqrt 2)) / 2`, `y = x Phi`,
//! `dx += dy (Phi + x e^(-x^2/2) / sqrt(2 pi))` with aclnnMul / aclnnMuls / aclnnAdd.

use crate::backend::npu_pending;
use crate::error::Result;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// `aclnnGeluV2(self = x, approximate = "none", out = y)`.
pub fn forward<E: Float>(
    ordinal: u32,
    _stream: &Stream,
    _y: &mut BufferViewMut<'_, E>,
    _x: &BufferView<'_, E>,
) -> Result<()> {
    Err(npu_pending("gelu_forward", ordinal, "aclnnGeluV2"))
}

/// `aclnnGeluBackwardV2(gradOutput = dy, self = x, approximate = "none", gradInput)` into an
/// `[N]` scratch (the op writes), then `aclnnInplaceAdd` into `dx` (our backward
/// accumulates).
pub fn backward<E: Float>(
    ordinal: u32,
    _stream: &Stream,
    _dx: &mut BufferViewMut<'_, E>,
    _dy: &BufferView<'_, E>,
    _x: &BufferView<'_, E>,
) -> Result<()> {
    Err(npu_pending(
        "gelu_backward",
        ordinal,
        "aclnnGeluBackwardV2 + aclnnInplaceAdd",
    ))
}
