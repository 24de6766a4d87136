//! Embedding's NPU entry points (bodies land with the NPU issue; until then they return
//! [`npu_pending`]: `NotCompiled` without `--features npu`, `Unsupported` with it).
//!
//! Both bodies first check the ids on the host as the slice-level calls do, then upload them
//! as int32 (aclnn indices are int32/int64; ids below V < 2^31 fit).

use crate::backend::npu_pending;
use crate::error::Result;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// `aclnnEmbedding(weight [V, D], indices = ids [T], out [T, D])`.
pub fn forward<E: Float>(
    ordinal: u32,
    _stream: &Stream,
    _out: &mut BufferViewMut<'_, E>,
    _ids: &[u32],
    _weight: &BufferView<'_, E>,
    _dim: usize,
) -> Result<()> {
    Err(npu_pending("embedding_forward", ordinal, "aclnnEmbedding"))
}

/// `aclnnEmbeddingDenseBackward(grad = dout, indices = ids, numWeights = V, paddingIdx = no
/// padding, scaleGradByFreq = false, out)` into a `[V, D]` f32 scratch (the op writes; a bf16
/// `dout` is widened with aclnnCast first), then `aclnnInplaceAdd` into `dweight`. That
/// scratch is the size of the table (2.7 GB at V = 131072, D = 5120), so the NPU issue should
/// prefer an accumulating scatter (aclnnIndexAdd, not bound yet) where the part has it.
pub fn backward<E: Float>(
    ordinal: u32,
    _stream: &Stream,
    _dweight: &mut BufferViewMut<'_, f32>,
    _dout: &BufferView<'_, E>,
    _ids: &[u32],
    _dim: usize,
) -> Result<()> {
    Err(npu_pending(
        "embedding_backward",
        ordinal,
        "aclnnEmbeddingDenseBackward + aclnnInplaceAdd",
    ))
}
