//! Varlen attention's NPU bodies: aclnnFlashAttentionVarLenScore and
//! aclnnFlashAttentionUnpaddingScoreGrad (aclnn_flash_attention_score{,_grad}.h).
//!
//! The aclnn mapping (docs/cann-api.md §0 items 4-7 and the FlashAttention sections):
//! `inputLayout = "TND"`, `actualSeqQLen = actualSeqKvLen = cu_seqlens` as a HOST
//! `aclIntArray` of cumulative ends without a leading 0 (our convention already), `headNum =
//! Hq` (GQA from the k/v shapes), `scaleValue = a.scale` (the op has no default; torch's would
//! be 1.0), causal = `sparseMode 3` with the 2048 x 2048 `triu(ones, 1)` uint8 mask, full =
//! `sparseMode 0` without a mask. The op's softmaxMax/softmaxSum (`T*Hq*8` f32, NTD order) are
//! its own opaque forward-to-backward state: on the NPU the `lse` buffer holds them (the
//! caller sizes it with [`lse_len_npu`]) and only the NPU backward reads them.

//!
//! The causal mask (2048 x 2048 uint8, 4 MiB) is uploaded once per device and kept for the
//! process (as torch_npu keeps its own); it shows in the device allocator's figures.
#![cfg_attr(
    not(feature = "npu"),
    allow(unused_variables, unused_imports, dead_code)
)]

use super::{BlockAttention, QkvBuf, QkvGradBuf, VarlenAttention};
use crate::backend::npu_body;
use crate::error::Result;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// f32 values a ring block's `lse` accumulator holds on the NPU: softmaxMax and softmaxSum,
/// `Tq * Hq * 8` each (the CPU keeps one log-sum-exp per row and head).
pub fn block_lse_len_npu(a: &BlockAttention) -> usize {
    2 * a.q_tokens * a.q_heads * 8
}

/// The softmax max an empty NPU accumulator starts from: finite (aclnnRingAttentionUpdate's
/// inputs are), and so far below any score that `e^(EMPTY_MAX - m)` is 0 in f32.
pub const BLOCK_EMPTY_MAX: f32 = -1e30;

/// f32 values per (token, query head) the NPU's statistics take ([`super::lse_per_head`]).
fn npu_lse_per_head(ordinal: u32) -> usize {
    super::lse_per_head(cannon_runtime::Device::Npu(ordinal))
}

/// A ring attention block's forward on the NPU, per query range and each of its key ranges:
/// `aclnnFlashAttentionVarLenScore` of the range's queries against the keys (one sequence,
/// causal on the diagonal block) into scratch, cast to f32, then
/// `aclnnRingAttentionUpdate("SBH", prev = the accumulators' rows, cur = the block)` into
/// scratch copied back to the accumulators' rows.
///
/// The statistics of a query range `r` are one block of `lse` at `r.start * Hq * 8` in the
/// order the FlashAttention call writes for one sequence, `[Hq, |r|, 8]` (max in the first
/// half of `lse`, sum in the second), so every call on the same accumulators must name the
/// same query ranges (ring's pairs do: a range is one sequence's piece of a chunk). An empty
/// accumulator is `out = 0`, max [`BLOCK_EMPTY_MAX`], sum 1 ([`super::block_lse_init`]).
pub fn block_forward<E: Float>(
    ordinal: u32,
    stream: &Stream,
    a: &BlockAttention,
    x: QkvBuf<'_, E>,
    out: &mut BufferViewMut<'_, f32>,
    lse: &mut BufferViewMut<'_, f32>,
) -> Result<()> {
    const OP: &str = "attention_block_forward";
    npu_body!(
        OP,
        ordinal,
        "aclnnFlashAttentionVarLenScore + aclnnRingAttentionUpdate",
        {
            let per_head = npu_lse_per_head(ordinal);
            super::check_block_forward(a, per_head, x.lens(), out.len(), lse.len())?;
            let half = lse.len() / 2;
            let (hq, d) = (a.q_heads, a.head_dim);
            for (qr, keys) in a.groups(OP, true)? {
                let rows = qr.start * hq * d..qr.end * hq * d;
                let (max, sum) = (
                    qr.start * hq * 8..qr.end * hq * 8,
                    half + qr.start * hq * 8..half + qr.end * hq * 8,
                );
                for (kr, causal) in keys {
                    let mut cur =
                        imp::pair_forward(OP, ordinal, stream, a, &x, (&qr, &kr, causal))?;
                    let next = {
                        let (o, l) = (out.as_view(), lse.as_view());
                        let prev = imp::prev(&o, &l, [rows.clone(), max.clone(), sum.clone()])?;
                        imp::ring_update(OP, stream, prev, &mut cur, (qr.len(), hq, d))?
                    };
                    out.slice_mut(rows.clone())?
                        .memcpy_dtod(stream, &next.out.view())?;
                    lse.slice_mut(max.clone())?
                        .memcpy_dtod(stream, &next.max.view())?;
                    lse.slice_mut(sum.clone())?
                        .memcpy_dtod(stream, &next.sum.view())?;
                }
            }
            Ok(())
        }
    )
}

/// A ring attention block's backward on the NPU, per pair:
/// `aclnnFlashAttentionUnpaddingScoreGrad` of the pair's queries against its keys with the
/// rows' FINAL statistics and output (so that its softmax is the whole row's, as ring's
/// backward needs), into scratch in `E`, cast to f32 (unless E is f32) and added to dq, dk,
/// dv's rows (`aclnnCast`, `aclnnInplaceAdd`). The statistics are read as [`block_forward`] keeps them.
#[allow(clippy::too_many_arguments)] // the entry point's arguments after ordinal and stream
pub fn block_backward<E: Float>(
    ordinal: u32,
    stream: &Stream,
    a: &BlockAttention,
    x: QkvBuf<'_, E>,
    out: &BufferView<'_, E>,
    lse: &BufferView<'_, f32>,
    dout: &BufferView<'_, E>,
    g: QkvGradBuf<'_, '_, f32>,
) -> Result<()> {
    const OP: &str = "attention_block_backward";
    npu_body!(OP, ordinal, "aclnnFlashAttentionUnpaddingScoreGrad", {
        let saved = (out.len(), lse.len(), dout.len());
        let per_head = npu_lse_per_head(ordinal);
        super::check_block_backward(a, per_head, x.lens(), saved, g.lens())?;
        let (hq, hkv, d) = (a.q_heads, a.kv_heads, a.head_dim);
        for (qr, keys) in a.groups(OP, true)? {
            for (kr, causal) in keys {
                let [gq, gk, gv] =
                    imp::pair_backward(OP, stream, a, &x, (out, lse, dout), (&qr, &kr, causal))?;
                let qrows = qr.start * hq * d..qr.end * hq * d;
                let krows = kr.start * hkv * d..kr.end * hkv * d;
                for (grad, acc, rows) in [
                    (gq, &mut *g.dq, qrows),
                    (gk, &mut *g.dk, krows.clone()),
                    (gv, &mut *g.dv, krows),
                ] {
                    let mut wide;
                    let src = match imp::as_f32(&grad) {
                        Some(same) => same.view(),
                        None => {
                            wide = cannon_runtime::DeviceBuffer::<f32>::alloc(stream, grad.len())?;
                            let mut w = wide.view_mut();
                            crate::cast::npu::convert(ordinal, stream, &grad.view(), &mut w)?;
                            wide.view()
                        }
                    };
                    let mut dst = acc.slice_mut(rows)?;
                    crate::elementwise::npu::add_into(ordinal, stream, &mut dst, &src)?;
                }
            }
        }
        Ok(())
    })
}

/// f32 values the NPU keeps between forward and backward: softmaxMax and softmaxSum,
/// `T * Hq * 8` each.
pub fn lse_len_npu(a: &VarlenAttention) -> usize {
    2 * a.tokens * a.q_heads * 8
}

#[cfg(feature = "npu")]
mod imp;

/// `aclnnFlashAttentionVarLenScore` over the batch's sequences (`actualSeqQLen =
/// actualSeqKvLen = cu_seqlens`), softmaxMaxOut = lse[..half], softmaxSumOut = lse[half..].
pub fn forward<E: Float>(
    ordinal: u32,
    stream: &Stream,
    a: &VarlenAttention,
    x: QkvBuf<'_, E>,
    out: &mut BufferViewMut<'_, E>,
    lse: &mut BufferViewMut<'_, f32>,
) -> Result<()> {
    const OP: &str = "attention_forward";
    npu_body!(OP, ordinal, "aclnnFlashAttentionVarLenScore", {
        use crate::backend::aclnn::AclTensor;
        let per_head = npu_lse_per_head(ordinal);
        super::check_forward(a, per_head, x.lens(), out.len(), lse.len())?;
        if a.tokens == 0 {
            return Ok(());
        }
        let (t, hq) = (a.tokens, a.q_heads);
        let half = lse.len() / 2;
        let mut args = imp::args(OP, stream, a)?;
        let input = imp::qkv(OP, (t, t), (hq, a.kv_heads, a.head_dim), (x.q, x.k, x.v))?;
        let outs = [
            AclTensor::from_view_mut(OP, &mut lse.slice_mut(0..half)?, &[t, hq, 8])?,
            AclTensor::from_view_mut(OP, &mut lse.slice_mut(half..2 * half)?, &[t, hq, 8])?,
            AclTensor::from_view_mut(OP, out, &[t, hq, a.head_dim])?,
        ];
        imp::fa_forward(OP, stream, &mut args, &input, &outs)
    })
}

/// `aclnnFlashAttentionUnpaddingScoreGrad` with the forward's softmaxMax/Sum and output:
/// writes dq/dk/dv, matching our overwrite convention.
#[allow(clippy::too_many_arguments)]
pub fn backward<E: Float>(
    ordinal: u32,
    stream: &Stream,
    a: &VarlenAttention,
    x: QkvBuf<'_, E>,
    out: &BufferView<'_, E>,
    lse: &BufferView<'_, f32>,
    dout: &BufferView<'_, E>,
    g: QkvGradBuf<'_, '_, E>,
) -> Result<()> {
    const OP: &str = "attention_backward";
    npu_body!(OP, ordinal, "aclnnFlashAttentionUnpaddingScoreGrad", {
        use crate::backend::aclnn::AclTensor;
        let saved = (out.len(), lse.len(), dout.len());
        let per_head = npu_lse_per_head(ordinal);
        super::check_backward(a, per_head, x.lens(), saved, g.lens())?;
        if a.tokens == 0 {
            return Ok(());
        }
        let (t, hq, hkv, d) = (a.tokens, a.q_heads, a.kv_heads, a.head_dim);
        let half = lse.len() / 2;
        let mut args = imp::args(OP, stream, a)?;
        let input = imp::qkv(OP, (t, t), (hq, hkv, d), (x.q, x.k, x.v))?;
        let saved = [
            AclTensor::from_view(OP, out, &[t, hq, d])?,
            AclTensor::from_view(OP, dout, &[t, hq, d])?,
            AclTensor::from_view(OP, &lse.slice(0..half)?, &[t, hq, 8])?,
            AclTensor::from_view(OP, &lse.slice(half..2 * half)?, &[t, hq, 8])?,
        ];
        let grads = [
            AclTensor::from_view_mut(OP, g.dq, &[t, hq, d])?,
            AclTensor::from_view_mut(OP, g.dk, &[t, hkv, d])?,
            AclTensor::from_view_mut(OP, g.dv, &[t, hkv, d])?,
        ];
        imp::fa_backward(OP, stream, &mut args, &input, &saved, &grads)
    })
}
