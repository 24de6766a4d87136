//! The casts' NPU entry points (bodies land with the NPU issue; until then they return
//! [`npu_pending`]: `NotCompiled` without `--features npu`, `Unsupported` with it).
//!
//! To check when the bodies land: the CPU rounding is ties-to-even and keeps NaN payloads
//! (quiet bit set); aclnnCast's f32 -> bf16 must be compared bit for bit on the cast tests'
//! inputs (ties, overflow to infinity, NaN).

use crate::backend::npu_pending;
use crate::error::Result;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// `aclnnCast(self = src, dtype = B's aclDataType, out = dst)` (ACL_BF16 rounds to nearest
/// even, ACL_FLOAT widens exactly); when `A` and `B` are the same type, a device copy
/// (`memcpy_dtod`) instead.
pub fn convert<A: Float, B: Float>(
    ordinal: u32,
    _stream: &Stream,
    _src: &BufferView<'_, A>,
    _dst: &mut BufferViewMut<'_, B>,
) -> Result<()> {
    Err(npu_pending("cast", ordinal, "aclnnCast"))
}
