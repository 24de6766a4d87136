//! Elementwise ops' NPU entry points (bodies land with the NPU issue; until then they return
//! [`npu_pending`]: `NotCompiled` without `--features npu`, `Unsupported` with it).
//!
//! Each is one aclnn call on `[N]` tensors over the views: `aclnnInplaceAdd(self = y,
//! other = x, alpha = 1)`, `aclnnMul(self = a, other = b, out)`, `aclnnInplaceMul(self = y,
//! other = x)`. bf16 operands compute in f32 and round once on store, as on the CPU.

use crate::backend::npu_pending;
use crate::error::Result;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// `aclnnInplaceAdd(y, x, alpha = 1)`.
pub fn add_into<E: Float>(
    ordinal: u32,
    _stream: &Stream,
    _y: &mut BufferViewMut<'_, E>,
    _x: &BufferView<'_, E>,
) -> Result<()> {
    Err(npu_pending("add_into", ordinal, "aclnnInplaceAdd"))
}

/// `aclnnMul(a, b, out)`.
pub fn mul<E: Float>(
    ordinal: u32,
    _stream: &Stream,
    _out: &mut BufferViewMut<'_, E>,
    _a: &BufferView<'_, E>,
    _b: &BufferView<'_, E>,
) -> Result<()> {
    Err(npu_pending("mul", ordinal, "aclnnMul"))
}

/// `aclnnInplaceMul(y, x)`.
pub fn mul_into<E: Float>(
    ordinal: u32,
    _stream: &Stream,
    _y: &mut BufferViewMut<'_, E>,
    _x: &BufferView<'_, E>,
) -> Result<()> {
    Err(npu_pending("mul_into", ordinal, "aclnnInplaceMul"))
}
