//! Cross-entropy's NPU entry points (bodies land with the NPU issue; until then they return
//! [`npu_pending`]: `NotCompiled` without `--features npu`, `Unsupported` with it).
//!
//! Every body checks and counts the labels on the host as the slice-level calls do (and
//! handles `Mean` over no label there: loss 0, zero gradient), uploads them, then:
//!
//! ```text
//! losses[N]       = aclnnCrossEntropyLoss(logits, labels, reduction "none", ignoreIndex -100,
//!                   labelSmoothing 0; logProbOut [N, V] kept for the gradient)
//! loss, sum       = losses copied to the host and summed in f64 in row order (as the CPU)
//! d_logits[N, V]  = aclnnCrossEntropyLossGrad(gradLoss = 1/divisor on every row, logProb,
//!                   labels, reduction "none", ignoreIndex -100)   (ignored rows get 0)
//! ```

use super::{CeStats, LmHeadGrads, LossNorm};
use crate::backend::npu_pending;
use crate::error::Result;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// `aclnnCrossEntropyLoss` (+ `aclnnCrossEntropyLossGrad` into `d_logits` when given).
pub fn full(
    ordinal: u32,
    _stream: &Stream,
    _logits: &BufferView<'_, f32>,
    _labels: &[i32],
    _vocab: usize,
    _d_logits: Option<&mut BufferViewMut<'_, f32>>,
    _norm: LossNorm,
) -> Result<CeStats> {
    Err(npu_pending(
        "cross_entropy",
        ordinal,
        "aclnnCrossEntropyLoss (+ aclnnCrossEntropyLossGrad)",
    ))
}

/// As [`full`], with aclnnCrossEntropyLossGrad writing into `logits` itself (its input is
/// logProb, so the logits are no longer read by then).
pub fn in_place(
    ordinal: u32,
    _stream: &Stream,
    _logits: &mut BufferViewMut<'_, f32>,
    _labels: &[i32],
    _vocab: usize,
    _norm: LossNorm,
) -> Result<CeStats> {
    Err(npu_pending(
        "cross_entropy_in_place",
        ordinal,
        "aclnnCrossEntropyLoss + aclnnCrossEntropyLossGrad",
    ))
}

/// Per block of `chunk_rows` rows (blocks whose labels are all ignored skipped, as on the
/// CPU): `logits = aclnnMatmul(h[rows], w^T view)` into one `[chunk_rows, V]` f32 scratch,
/// `aclnnCrossEntropyLoss` (+ `aclnnCrossEntropyLossGrad` in place), then the lm_head
/// backward of `linear::npu`: `dh[rows] += aclnnMatmul(dl, w)`, `dw += aclnnMatmul(dl^T, h[rows])`
/// (aclnnInplaceAdd). Row losses are summed in f64 in row order across blocks, as on the CPU.
#[allow(clippy::too_many_arguments)]
pub fn chunked_lm_head(
    ordinal: u32,
    _stream: &Stream,
    _h: &BufferView<'_, f32>,
    _w: &BufferView<'_, f32>,
    _labels: &[i32],
    _d_model: usize,
    _vocab: usize,
    _chunk_rows: usize,
    _norm: LossNorm,
    _grads: LmHeadGrads<'_>,
) -> Result<CeStats> {
    Err(npu_pending(
        "cross_entropy_chunked",
        ordinal,
        "aclnnMatmul + aclnnCrossEntropyLoss (+ aclnnCrossEntropyLossGrad) per chunk",
    ))
}
