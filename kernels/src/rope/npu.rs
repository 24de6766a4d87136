//! RoPE's NPU entry points (bodies land with the NPU issue; until then they return
//! [`npu_pending`]: `NotCompiled` without `--features npu`, `Unsupported` with it).
//!
//! Both bodies check `pos` against the table on the host, gather per token the rows
//! `cos = concat(c, c)`, `sin = concat(s, s)` (`[T, D]`, the rotate-half layout) and upload
//! them. The 2-D axial (Pixtral) RoPE needs no op of its own: its table already lays the row
//! angles and then the column angles out along D/2, so it is the same rotate-half call with
//! that table's rows. The op writes a separate output; the bodies write a `[T, H, D]` scratch
//! and copy it back (`memcpy_dtod`) to keep the in-place contract. Where
//! aclnnRotaryPositionEmbedding is absent (the CANN 8.1.RC1 headers lack it) the documented
//! composition is `x cos + rotate_half(x) sin` with aclnnMul / aclnnAdd over the half views.

use super::RopeTable;
use crate::backend::npu_pending;
use crate::error::Result;
use cannon_runtime::Float;
use cannon_runtime::{BufferViewMut, Stream};

/// `aclnnRotaryPositionEmbedding(x viewed [1, T, H, D] (BSND), cos, sin viewed [1, T, 1, D],
/// mode = 0 (rotate-half), out)`.
pub fn forward<E: Float>(
    ordinal: u32,
    _stream: &Stream,
    _x: &mut BufferViewMut<'_, E>,
    _n_heads: usize,
    _table: &RopeTable,
    _pos: &[u32],
) -> Result<()> {
    Err(npu_pending(
        "rope_forward",
        ordinal,
        "aclnnRotaryPositionEmbedding",
    ))
}

/// `aclnnRotaryPositionEmbeddingGrad(dy = dx, cos, sin, xOptional = null, mode = 0, dxOut,
/// dcosOut = null, dsinOut = null)`: the inverse rotation (equivalently the forward call with
/// `-sin`).
pub fn backward<E: Float>(
    ordinal: u32,
    _stream: &Stream,
    _dx: &mut BufferViewMut<'_, E>,
    _n_heads: usize,
    _table: &RopeTable,
    _pos: &[u32],
) -> Result<()> {
    Err(npu_pending(
        "rope_backward",
        ordinal,
        "aclnnRotaryPositionEmbeddingGrad",
    ))
}
