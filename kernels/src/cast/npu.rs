//! The casts' NPU entry points (bodies land with the NPU issue; until then they return
//! [`npu_pending`]: `NotCompiled` without `--features npu`, `Unsupported` with it).
//!
//! To check when the bodies land: the CPU rounding is ties-to-even and keeps NaN payloads
//! (quiet bit set); aclnnCast's f32 -> bf16 must be compared bit for bit on the cast tests'
//! inputs (ties, overflow to infinity, NaN).

use super::Elem;
use crate::device::npu_pending;
use crate::error::Result;
use cannon_runtime::{BufferView, BufferViewMut, Stream};
use half::bf16;

/// `aclnnCast(self = src, dtype = ACL_BF16, out = dst)`.
pub fn f32_to_bf16(
    ordinal: u32,
    _stream: &Stream,
    _src: &BufferView<'_, f32>,
    _dst: &mut BufferViewMut<'_, bf16>,
) -> Result<()> {
    Err(npu_pending("cast_f32_to_bf16", ordinal, "aclnnCast"))
}

/// `aclnnCast(self = src, dtype = ACL_FLOAT, out = dst)`.
pub fn bf16_to_f32(
    ordinal: u32,
    _stream: &Stream,
    _src: &BufferView<'_, bf16>,
    _dst: &mut BufferViewMut<'_, f32>,
) -> Result<()> {
    Err(npu_pending("cast_bf16_to_f32", ordinal, "aclnnCast"))
}

/// `aclnnCast` to `B`'s dtype; when `A` and `B` are the same type, a device copy
/// (`memcpy_dtod`) instead.
pub fn convert<A: Elem + cannon_runtime::Element, B: Elem + cannon_runtime::Element>(
    ordinal: u32,
    _stream: &Stream,
    _src: &BufferView<'_, A>,
    _dst: &mut BufferViewMut<'_, B>,
) -> Result<()> {
    Err(npu_pending("cast", ordinal, "aclnnCast"))
}
