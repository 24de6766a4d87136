//! The aclnn calls behind the NPU entry points of `super` (compiled with `--features npu`):
//! the flash-attention argument descriptors, the cached causal mask, and the forward and
//! backward launches.

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
