//! Varlen attention's NPU entry points (bodies land with the NPU issue; until then they return
//! [`npu_pending`]: `NotCompiled` without `--features npu`, `Unsupported` with it).
//!
//! The aclnn mapping (docs/cann-api.md §0 items 4-7 and the FlashAttention sections):
//! `inputLayout = "TND"`, `actualSeqQLen = actualSeqKvLen = cu_seqlens` as a HOST
//! `aclIntArray` of cumulative ends without a leading 0 (our convention already), `headNum =
//! Hq` (GQA from the k/v shapes), `scaleValue = a.scale` (the op has no default; torch's would
//! be 1.0), causal = `sparseMode 3` with the 2048 x 2048 `triu(ones, 1)` uint8 mask, full =
//! `sparseMode 0` without a mask. The op's softmaxMax/softmaxSum (`T*Hq*8` f32, NTD order) are
//! its own opaque forward-to-backward state: on the NPU the `lse` buffer holds them (the
//! caller sizes it with [`lse_len_npu`]) and only the NPU backward reads them.

use super::{QkvBuf, QkvGradBuf, VarlenAttention};
use crate::backend::npu_pending;
use crate::error::Result;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// f32 values the NPU keeps between forward and backward: softmaxMax and softmaxSum,
/// `T * Hq * 8` each.
pub fn lse_len_npu(a: &VarlenAttention) -> usize {
    2 * a.tokens * a.q_heads * 8
}

/// `aclnnFlashAttentionVarLenScore(q, k, v, ..., attenMask (causal), actualSeqQLen,
/// actualSeqKvLen, scaleValue, keepProb = 1, preTokens/nextTokens = i32::MAX, headNum,
/// "TND", innerPrecise = 0, sparseMode, softmaxMaxOut, softmaxSumOut, softmaxOut (unused),
/// attentionOut)`.
pub fn forward<E: Float>(
    ordinal: u32,
    _stream: &Stream,
    _a: &VarlenAttention,
    _x: QkvBuf<'_, E>,
    _out: &mut BufferViewMut<'_, E>,
    _lse: &mut BufferViewMut<'_, f32>,
) -> Result<()> {
    Err(npu_pending(
        "attention_forward",
        ordinal,
        "aclnnFlashAttentionVarLenScore",
    ))
}

/// `aclnnFlashAttentionUnpaddingScoreGrad(q, k, v, dy = dout, ..., softmaxMax, softmaxSum,
/// attentionIn = out, actualSeqQLen, actualSeqKvLen, scaleValue, ..., "TND", sparseMode,
/// dqOut, dkOut, dvOut)`: writes dq/dk/dv, matching our overwrite convention.
#[allow(clippy::too_many_arguments)]
pub fn backward<E: Float>(
    ordinal: u32,
    _stream: &Stream,
    _a: &VarlenAttention,
    _x: QkvBuf<'_, E>,
    _out: &BufferView<'_, E>,
    _lse: &BufferView<'_, f32>,
    _dout: &BufferView<'_, E>,
    _g: QkvGradBuf<'_, '_, E>,
) -> Result<()> {
    Err(npu_pending(
        "attention_backward",
        ordinal,
        "aclnnFlashAttentionUnpaddingScoreGrad",
    ))
}
