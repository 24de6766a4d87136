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
mod imp {
    use super::*;
    use crate::backend::aclnn::{aclnn, AclIntArray, AclTensor};
    use cannon_runtime::DeviceBuffer;
    use std::any::Any;
    use std::collections::HashMap;
    use std::ops::Range;
    use std::sync::{Mutex, OnceLock};

    pub(super) const MASK: usize = 2048;

    /// The descriptors and attributes both calls share.
    pub(super) struct Args {
        pub seq_q: AclIntArray,
        pub seq_kv: AclIntArray,
        pub mask: Option<AclTensor>,
        pub heads: i64,
        pub sparse_mode: i64,
        pub pre: i64,
        pub next: i64,
        pub layout: [u8; 4],
        pub scale: f64,
    }

    /// The device address of device `stream`'s `triu(ones(2048, 2048), 1)` uint8 mask.
    fn mask(stream: &Stream) -> Result<usize> {
        static MASKS: OnceLock<Mutex<HashMap<String, DeviceBuffer<u8>>>> = OnceLock::new();
        let key = stream.device().to_string();
        let mut g = MASKS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(b) = g.get(&key) {
            return Ok(b.as_raw_ptr() as usize);
        }
        let host: Vec<u8> = (0..MASK * MASK)
            .map(|i| (i % MASK > i / MASK) as u8)
            .collect();
        let b = DeviceBuffer::<u8>::clone_htod(stream, &host)?;
        let p = b.as_raw_ptr() as usize;
        g.insert(key, b);
        Ok(p)
    }

    /// Arguments for sequences ending at `q_ends` (queries) and `kv_ends` (keys/values).
    fn args_for(
        op: &'static str,
        stream: &Stream,
        (q_ends, kv_ends): (&[i64], &[i64]),
        causal: bool,
        heads: usize,
        scale: f32,
    ) -> Result<Args> {
        let (mask, sparse_mode, pre, next) = if causal {
            let m = mask(stream)?;
            // SAFETY: the cached mask buffer (2048 * 2048 u8), never freed.
            let t = unsafe {
                AclTensor::strided::<u8>(
                    op,
                    m as *mut std::ffi::c_void,
                    &[MASK as i64; 2],
                    &[MASK as i64, 1],
                    &[MASK as i64; 2],
                )
            }?;
            // torch_npu's causal recipe: right-down causal, pre/next tokens (ignored by the
            // mode) as its docstring passes them.
            (Some(t), 3, 65536, 0)
        } else {
            (None, 0, i32::MAX as i64, i32::MAX as i64)
        };
        Ok(Args {
            seq_q: AclIntArray::new(op, q_ends)?,
            seq_kv: AclIntArray::new(op, kv_ends)?,
            mask,
            heads: heads as i64,
            sparse_mode,
            pre,
            next,
            layout: *b"TND\0",
            scale: scale as f64,
        })
    }

    pub(super) fn args(op: &'static str, stream: &Stream, a: &VarlenAttention) -> Result<Args> {
        let ends: Vec<i64> = a.cu_seqlens.iter().map(|&e| e as i64).collect();
        args_for(op, stream, (&ends, &ends), a.causal, a.q_heads, a.scale)
    }

    /// `[q, k, v]` as TND tensors of `nq` and `nk` tokens.
    pub(super) fn qkv<E: Float>(
        op: &'static str,
        (nq, nk): (usize, usize),
        (hq, hkv, d): (usize, usize, usize),
        (q, k, v): (&BufferView<'_, E>, &BufferView<'_, E>, &BufferView<'_, E>),
    ) -> Result<[AclTensor; 3]> {
        Ok([
            AclTensor::from_view(op, q, &[nq, hq, d])?,
            AclTensor::from_view(op, k, &[nk, hkv, d])?,
            AclTensor::from_view(op, v, &[nk, hkv, d])?,
        ])
    }

    /// `aclnnFlashAttentionVarLenScore(q, k, v, pse/dropMask/paddingMask = null, attenMask
    /// (causal), prefix = null, actualSeqQLen, actualSeqKvLen, scaleValue, keepProb = 1,
    /// preTokens, nextTokens, headNum, "TND", innerPrecise = 0, sparseMode, softmaxMaxOut,
    /// softmaxSumOut, softmaxOut = null, attentionOut)`.
    pub(super) fn fa_forward(
        op: &'static str,
        stream: &Stream,
        args: &mut Args,
        [qt, kt, vt]: &[AclTensor; 3],
        [mt, st, ot]: &[AclTensor; 3],
    ) -> Result<()> {
        let null = std::ptr::null();
        aclnn!(
            op,
            stream,
            aclnnFlashAttentionVarLenScoreGetWorkspaceSize,
            aclnnFlashAttentionVarLenScore,
            (
                qt.raw(),
                kt.raw(),
                vt.raw(),
                null,
                null,
                null,
                args.mask.as_ref().map_or(null, |m| m.raw()),
                std::ptr::null(),
                args.seq_q.raw(),
                args.seq_kv.raw(),
                args.scale,
                1.0,
                args.pre,
                args.next,
                args.heads,
                args.layout.as_mut_ptr() as *mut std::ffi::c_char,
                0,
                args.sparse_mode,
                mt.raw(),
                st.raw(),
                null,
                ot.raw()
            )
        )
    }

    /// `aclnnFlashAttentionUnpaddingScoreGrad(q, k, v, dy, pse/dropMask/paddingMask = null,
    /// attenMask, softmaxMax, softmaxSum, softmaxIn = null, attentionIn = out, prefix = null,
    /// actualSeqQLen, actualSeqKvLen, scaleValue, ..., "TND", sparseMode, dqOut, dkOut, dvOut,
    /// dpseOut = null)`; `saved` is `[out, dy, max, sum]`.
    pub(super) fn fa_backward(
        op: &'static str,
        stream: &Stream,
        args: &mut Args,
        [qt, kt, vt]: &[AclTensor; 3],
        [ot, dyt, mt, st]: &[AclTensor; 4],
        [dqt, dkt, dvt]: &[AclTensor; 3],
    ) -> Result<()> {
        let null = std::ptr::null();
        aclnn!(
            op,
            stream,
            aclnnFlashAttentionUnpaddingScoreGradGetWorkspaceSize,
            aclnnFlashAttentionUnpaddingScoreGrad,
            (
                qt.raw(),
                kt.raw(),
                vt.raw(),
                dyt.raw(),
                null,
                null,
                null,
                args.mask.as_ref().map_or(null, |m| m.raw()),
                mt.raw(),
                st.raw(),
                null,
                ot.raw(),
                std::ptr::null(),
                args.seq_q.raw(),
                args.seq_kv.raw(),
                args.scale,
                1.0,
                args.pre,
                args.next,
                args.heads,
                args.layout.as_mut_ptr() as *mut std::ffi::c_char,
                0,
                args.sparse_mode,
                dqt.raw(),
                dkt.raw(),
                dvt.raw(),
                null
            )
        )
    }

    /// A ring block's partial result for `n` query rows: the attention output (f32)
    /// `[n, Hq, D]` and its softmax max and sum, `[Hq, n, 8]` each.
    pub(super) struct Partial {
        pub out: DeviceBuffer<f32>,
        pub max: DeviceBuffer<f32>,
        pub sum: DeviceBuffer<f32>,
    }

    impl Partial {
        fn alloc(stream: &Stream, (n, hq, d): (usize, usize, usize)) -> Result<Self> {
            Ok(Partial {
                out: DeviceBuffer::alloc(stream, n * hq * d)?,
                max: DeviceBuffer::alloc(stream, n * hq * 8)?,
                sum: DeviceBuffer::alloc(stream, n * hq * 8)?,
            })
        }
    }

    /// The accumulators' rows of one query range, borrowed: `[out, max, sum]`.
    pub(super) fn prev<'a>(
        out: &BufferView<'a, f32>,
        lse: &BufferView<'a, f32>,
        [rows, max, sum]: [Range<usize>; 3],
    ) -> Result<[BufferView<'a, f32>; 3]> {
        Ok([out.slice(rows)?, lse.slice(max)?, lse.slice(sum)?])
    }

    /// The pair's FlashAttention forward: its queries `q` against its keys `k` (row ranges),
    /// one sequence, causal on the diagonal block; the output widened to f32 (written as f32
    /// when E is).
    pub(super) fn pair_forward<E: Float>(
        op: &'static str,
        ordinal: u32,
        stream: &Stream,
        a: &BlockAttention,
        x: &QkvBuf<'_, E>,
        (q, k, causal): (&Range<usize>, &Range<usize>, bool),
    ) -> Result<Partial> {
        let (hq, hkv, d) = (a.q_heads, a.kv_heads, a.head_dim);
        let (nq, nk) = (q.len(), k.len());
        let mut p = Partial::alloc(stream, (nq, hq, d))?;
        // With E = f32 FlashAttention writes the partial's output itself; otherwise into
        // `narrow`, widened after.
        let mut narrow = None;
        {
            let (qv, kv, vv) = (
                x.q.slice(q.start * hq * d..q.end * hq * d)?,
                x.k.slice(k.start * hkv * d..k.end * hkv * d)?,
                x.v.slice(k.start * hkv * d..k.end * hkv * d)?,
            );
            let input = qkv(op, (nq, nk), (hq, hkv, d), (&qv, &kv, &vv))?;
            let stats = [nq, hq, 8];
            let o: &mut DeviceBuffer<E> =
                match (&mut p.out as &mut dyn Any).downcast_mut::<DeviceBuffer<E>>() {
                    Some(same) => same,
                    None => narrow.insert(DeviceBuffer::<E>::alloc(stream, nq * hq * d)?),
                };
            let outs = [
                AclTensor::from_buffer(op, &mut p.max, &stats)?,
                AclTensor::from_buffer(op, &mut p.sum, &stats)?,
                AclTensor::from_buffer(op, o, &[nq, hq, d])?,
            ];
            let ends = ([nq as i64], [nk as i64]);
            let mut args = args_for(op, stream, (&ends.0, &ends.1), causal, hq, a.scale)?;
            fa_forward(op, stream, &mut args, &input, &outs)?;
        }
        if let Some(o) = &narrow {
            crate::cast::npu::convert(ordinal, stream, &o.view(), &mut p.out.view_mut())?;
        }
        Ok(p)
    }

    /// `b` as f32 when `E` is f32 (then a cast to f32 would be a copy).
    pub(super) fn as_f32<E: Float>(b: &DeviceBuffer<E>) -> Option<&DeviceBuffer<f32>> {
        (b as &dyn Any).downcast_ref::<DeviceBuffer<f32>>()
    }

    /// `aclnnRingAttentionUpdate(prev, cur, actualSeqQlen = null, "SBH")` into fresh
    /// buffers: one sequence of `n` rows is `[S = n, B = 1, H = Hq * D]` with statistics
    /// `[B = 1, N = Hq, S = n, 8]`, the FlashAttention call's own order for one sequence.
    pub(super) fn ring_update(
        op: &'static str,
        stream: &Stream,
        [po, pm, ps]: [BufferView<'_, f32>; 3],
        cur: &mut Partial,
        (n, hq, d): (usize, usize, usize),
    ) -> Result<Partial> {
        let mut next = Partial::alloc(stream, (n, hq, d))?;
        let (os, ss) = ([n, 1, hq * d], [1, hq, n, 8]);
        let prev = [
            AclTensor::from_view(op, &po, &os)?,
            AclTensor::from_view(op, &pm, &ss)?,
            AclTensor::from_view(op, &ps, &ss)?,
        ];
        let c = [
            AclTensor::from_buffer(op, &mut cur.out, &os)?,
            AclTensor::from_buffer(op, &mut cur.max, &ss)?,
            AclTensor::from_buffer(op, &mut cur.sum, &ss)?,
        ];
        let o = [
            AclTensor::from_buffer(op, &mut next.out, &os)?,
            AclTensor::from_buffer(op, &mut next.max, &ss)?,
            AclTensor::from_buffer(op, &mut next.sum, &ss)?,
        ];
        let mut layout = *b"SBH\0";
        aclnn!(
            op,
            stream,
            aclnnRingAttentionUpdateGetWorkspaceSize,
            aclnnRingAttentionUpdate,
            (
                prev[0].raw(),
                prev[1].raw(),
                prev[2].raw(),
                c[0].raw(),
                c[1].raw(),
                c[2].raw(),
                std::ptr::null(),
                layout.as_mut_ptr() as *mut std::ffi::c_char,
                o[0].raw(),
                o[1].raw(),
                o[2].raw()
            )
        )?;
        Ok(next)
    }

    /// The pair's FlashAttention backward with the rows' final statistics and output:
    /// `[dq, dk, dv]` of the pair's rows, in `E`.
    pub(super) fn pair_backward<E: Float>(
        op: &'static str,
        stream: &Stream,
        a: &BlockAttention,
        x: &QkvBuf<'_, E>,
        (out, lse, dout): (&BufferView<'_, E>, &BufferView<'_, f32>, &BufferView<'_, E>),
        (q, k, causal): (&Range<usize>, &Range<usize>, bool),
    ) -> Result<[DeviceBuffer<E>; 3]> {
        let (hq, hkv, d) = (a.q_heads, a.kv_heads, a.head_dim);
        let (nq, nk) = (q.len(), k.len());
        let half = lse.len() / 2;
        let (qrows, krows) = (
            q.start * hq * d..q.end * hq * d,
            k.start * hkv * d..k.end * hkv * d,
        );
        let stats = q.start * hq * 8..q.end * hq * 8;
        let (qv, kv, vv) = (
            x.q.slice(qrows.clone())?,
            x.k.slice(krows.clone())?,
            x.v.slice(krows)?,
        );
        let input = qkv(op, (nq, nk), (hq, hkv, d), (&qv, &kv, &vv))?;
        let (ov, dyv) = (out.slice(qrows.clone())?, dout.slice(qrows)?);
        let (mv, sv) = (
            lse.slice(stats.clone())?,
            lse.slice(half + stats.start..half + stats.end)?,
        );
        let saved = [
            AclTensor::from_view(op, &ov, &[nq, hq, d])?,
            AclTensor::from_view(op, &dyv, &[nq, hq, d])?,
            AclTensor::from_view(op, &mv, &[nq, hq, 8])?,
            AclTensor::from_view(op, &sv, &[nq, hq, 8])?,
        ];
        let mut g = [
            DeviceBuffer::<E>::alloc(stream, nq * hq * d)?,
            DeviceBuffer::<E>::alloc(stream, nk * hkv * d)?,
            DeviceBuffer::<E>::alloc(stream, nk * hkv * d)?,
        ];
        {
            let [gq, gk, gv] = &mut g;
            let grads = [
                AclTensor::from_buffer(op, gq, &[nq, hq, d])?,
                AclTensor::from_buffer(op, gk, &[nk, hkv, d])?,
                AclTensor::from_buffer(op, gv, &[nk, hkv, d])?,
            ];
            let ends = ([nq as i64], [nk as i64]);
            let mut args = args_for(op, stream, (&ends.0, &ends.1), causal, hq, a.scale)?;
            fa_backward(op, stream, &mut args, &input, &saved, &grads)?;
        }
        Ok(g)
    }
}

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
