//! GELU's NPU entry points (bodies land with the NPU issue; until then they return
//! [`npu_pending`]: `NotCompiled` without `--features npu`, `Unsupported` with it).
//!
//! CANN 8.x has the exact (erf) GELU as `aclnnGeluV2` / `aclnnGeluBackwardV2` with
//! `approximate = "none"` (V2 names the erf form explicitly rather than leaving it to the
//! op's default); neither is in `sys/src/generated/aclnn.rs` yet, so the NPU issue adds them
//! to the bindings' allowlist.
//! Where they are missing the documented composition is, from bound ops plus aclnnErf /
//! aclnnExp: `Phi = (1 + erf(x / sqrt 2)) / 2`, `y = x Phi`,
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
