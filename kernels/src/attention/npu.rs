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
use crate::error::{check_len, Result};
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// Ring attention's blocks have no NPU body yet: they would be
/// aclnnFlashAttentionVarLenScore calls with separate query and key lengths and the
/// log-sum-exp merge composed from aclnn elementwise ops. Until then the NPU runs context
/// parallelism as Ulysses.
fn ring_block_pending(op: &'static str, ordinal: u32) -> crate::error::KernelError {
    let device = cannon_runtime::Device::Npu(ordinal).to_string();
    if cfg!(feature = "npu") {
        crate::error::KernelError::Unsupported {
            op,
            device,
            reason: "ring attention blocks (parallel.cp_algo = ring or hybrid) have no NPU \
                     body yet; use parallel.cp_algo = ulysses on the NPU"
                .into(),
        }
    } else {
        crate::error::KernelError::NotCompiled { op, device }
    }
}

/// A ring attention block's forward on the NPU: the typed error of [`ring_block_pending`].
pub fn block_forward<E: Float>(
    ordinal: u32,
    _: &Stream,
    _: &BlockAttention,
    _: QkvBuf<'_, E>,
    _: &mut BufferViewMut<'_, f32>,
    _: &mut BufferViewMut<'_, f32>,
) -> Result<()> {
    Err(ring_block_pending("attention_block_forward", ordinal))
}

/// A ring attention block's backward on the NPU: the typed error of [`ring_block_pending`].
#[allow(clippy::too_many_arguments)] // the op list's arguments after ordinal and stream
pub fn block_backward<E: Float>(
    ordinal: u32,
    _: &Stream,
    _: &BlockAttention,
    _: QkvBuf<'_, E>,
    _: &BufferView<'_, E>,
    _: &BufferView<'_, f32>,
    _: &BufferView<'_, E>,
    _: QkvGradBuf<'_, '_, f32>,
) -> Result<()> {
    Err(ring_block_pending("attention_block_backward", ordinal))
}

/// f32 values the NPU keeps between forward and backward: softmaxMax and softmaxSum,
/// `T * Hq * 8` each.
pub fn lse_len_npu(a: &VarlenAttention) -> usize {
    2 * a.tokens * a.q_heads * 8
}

#[cfg(feature = "npu")]
mod imp {
    use super::*;
    use crate::backend::aclnn::{AclIntArray, AclTensor};
    use cannon_runtime::DeviceBuffer;
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};

    pub(super) const MASK: usize = 2048;

    /// The descriptors and attributes both calls share.
    pub(super) struct Args {
        pub seq: AclIntArray,
        pub mask: Option<AclTensor>,
        pub heads: i64,
        pub sparse_mode: i64,
        pub pre: i64,
        pub next: i64,
        pub layout: [u8; 4],
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

    pub(super) fn args(op: &'static str, stream: &Stream, a: &VarlenAttention) -> Result<Args> {
        let ends: Vec<i64> = a.cu_seqlens.iter().map(|&e| e as i64).collect();
        let seq = AclIntArray::new(op, &ends)?;
        let (mask, sparse_mode, pre, next) = if a.causal {
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
            seq,
            mask,
            heads: a.q_heads as i64,
            sparse_mode,
            pre,
            next,
            layout: *b"TND\0",
        })
    }

    pub(super) fn qkv<E: Float>(
        op: &'static str,
        a: &VarlenAttention,
        x: &QkvBuf<'_, E>,
    ) -> Result<[AclTensor; 3]> {
        Ok([
            AclTensor::from_view(op, x.q, &[a.tokens, a.q_heads, a.head_dim])?,
            AclTensor::from_view(op, x.k, &[a.tokens, a.kv_heads, a.head_dim])?,
            AclTensor::from_view(op, x.v, &[a.tokens, a.kv_heads, a.head_dim])?,
        ])
    }
}

fn check_shapes<E: cannon_runtime::Element>(
    op: &'static str,
    a: &VarlenAttention,
    x: &QkvBuf<'_, E>,
    lse: usize,
) -> Result<()> {
    a.validate(op)?;
    check_len(op, "q", x.q.len(), a.q_len())?;
    check_len(op, "k", x.k.len(), a.kv_len())?;
    check_len(op, "v", x.v.len(), a.kv_len())?;
    check_len(
        op,
        "lse (softmaxMax + softmaxSum, see lse_len_npu)",
        lse,
        lse_len_npu(a),
    )
}

/// `aclnnFlashAttentionVarLenScore(q, k, v, pse/dropMask/paddingMask = null, attenMask
/// (causal), prefix = null, actualSeqQLen = actualSeqKvLen = cu_seqlens, scaleValue,
/// keepProb = 1, preTokens, nextTokens, headNum, "TND", innerPrecise = 0, sparseMode,
/// softmaxMaxOut = lse[..half], softmaxSumOut = lse[half..], softmaxOut = null, attentionOut)`.
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
        use crate::backend::aclnn::{aclnn, AclTensor};
        check_shapes(OP, a, &x, lse.len())?;
        check_len(OP, "out", out.len(), a.q_len())?;
        if a.tokens == 0 {
            return Ok(());
        }
        let half = lse.len() / 2;
        let mut args = imp::args(OP, stream, a)?;
        let [qt, kt, vt] = imp::qkv(OP, a, &x)?;
        let ot = AclTensor::from_view_mut(OP, out, &[a.tokens, a.q_heads, a.head_dim])?;
        let mt =
            AclTensor::from_view_mut(OP, &mut lse.slice_mut(0..half)?, &[a.tokens, a.q_heads, 8])?;
        let st = AclTensor::from_view_mut(
            OP,
            &mut lse.slice_mut(half..2 * half)?,
            &[a.tokens, a.q_heads, 8],
        )?;
        let null = std::ptr::null();
        aclnn!(
            OP,
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
                args.seq.raw(),
                args.seq.raw(),
                a.scale as f64,
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
    })
}

/// `aclnnFlashAttentionUnpaddingScoreGrad(q, k, v, dy = dout, pse/dropMask/paddingMask =
/// null, attenMask, softmaxMax, softmaxSum, softmaxIn = null, attentionIn = out, prefix =
/// null, actualSeqQLen, actualSeqKvLen, scaleValue, ..., "TND", sparseMode, dqOut, dkOut,
/// dvOut, dpseOut = null)`: writes dq/dk/dv, matching our overwrite convention.
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
        use crate::backend::aclnn::{aclnn, AclTensor};
        check_shapes(OP, a, &x, lse.len())?;
        for (what, len, want) in [
            ("out", out.len(), a.q_len()),
            ("dout", dout.len(), a.q_len()),
            ("dq", g.dq.len(), a.q_len()),
            ("dk", g.dk.len(), a.kv_len()),
            ("dv", g.dv.len(), a.kv_len()),
        ] {
            check_len(OP, what, len, want)?;
        }
        if a.tokens == 0 {
            return Ok(());
        }
        let half = lse.len() / 2;
        let mut args = imp::args(OP, stream, a)?;
        let [qt, kt, vt] = imp::qkv(OP, a, &x)?;
        let q_shape = [a.tokens, a.q_heads, a.head_dim];
        let kv_shape = [a.tokens, a.kv_heads, a.head_dim];
        let ot = AclTensor::from_view(OP, out, &q_shape)?;
        let dyt = AclTensor::from_view(OP, dout, &q_shape)?;
        let mt = AclTensor::from_view(OP, &lse.slice(0..half)?, &[a.tokens, a.q_heads, 8])?;
        let st = AclTensor::from_view(OP, &lse.slice(half..2 * half)?, &[a.tokens, a.q_heads, 8])?;
        let dqt = AclTensor::from_view_mut(OP, g.dq, &q_shape)?;
        let dkt = AclTensor::from_view_mut(OP, g.dk, &kv_shape)?;
        let dvt = AclTensor::from_view_mut(OP, g.dv, &kv_shape)?;
        let null = std::ptr::null();
        aclnn!(
            OP,
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
                args.seq.raw(),
                args.seq.raw(),
                a.scale as f64,
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
    })
}
