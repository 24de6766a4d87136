//! The backward of one pre-norm block ([`block_backward`]): the forward's list of saved
//! tensors read bottom-up (see [`super::block`]), with the working tensors it reuses layer
//! after layer ([`BwdScratch`]). Apart from the forward, which recompute (`super::saved`)
//! runs again on its own.

use super::block::{
    gelu_tmp, BlockCtx, BlockDims, BlockGrads, BlockParams, BlockRefs, BlockWeights,
};
use super::gate::gated_backward;
use super::precision::{copy, linear_back, store, ActElem};
use super::ModelError;
use crate::parallel::cp::attn::AttnRefs;
use cannon_kernels::attention::QkvGradBuf;
use cannon_kernels::device_ctx::DeviceCtx;
use cannon_kernels::{ops, KernelError, Tensor};
use cannon_runtime::{BufferView, BufferViewMut, Stream};
use std::ops::Range;

type Result<T> = std::result::Result<T, KernelError>;
type ModelResult<T> = std::result::Result<T, ModelError>;

/// Working tensors of the backward, sized for T tokens and reused by every layer; the `A`
/// ones hold the attention's gradients.
#[derive(Debug)]
pub struct BwdScratch<A: cannon_runtime::Element> {
    dn: Tensor<f32>,          // [T,D]      d of a norm output
    dmid: Tensor<f32>,        // [T,D]
    datt32: Tensor<f32>,      // [T,Hq*Hd]  d att before storage
    dh: Tensor<f32>,          // [T,I]
    dgate: Tensor<f32>,       // [T,I]
    dup: Tensor<f32>,         // [T,I]
    tmp: Option<Tensor<f32>>, // [T,I]      GELU gate only
    datt: Tensor<A>,          // [T,Hq*Hd]
    dq: Tensor<A>,            // [T,Hq*Hd]
    dk: Tensor<A>,            // [T,Hkv*Hd]
    dv: Tensor<A>,            // [T,Hkv*Hd]
    /// `[D]` norm weight gradient of a frozen block (and of a frozen final norm).
    pub dw_sink: Tensor<f32>,
}

impl<A: ActElem> BwdScratch<A> {
    pub fn new(exec: &DeviceCtx, dims: &BlockDims, tokens: usize) -> Result<Self> {
        let (d, dq, dkv, i) = (dims.d, dims.dq(), dims.dkv(), dims.inter);
        Ok(BwdScratch {
            dn: exec.empty(&[tokens, d])?,
            dmid: exec.empty(&[tokens, d])?,
            datt32: exec.empty(&[tokens, dq])?,
            dh: exec.empty(&[tokens, i])?,
            dgate: exec.empty(&[tokens, i])?,
            dup: exec.empty(&[tokens, i])?,
            tmp: gelu_tmp(exec, dims, tokens)?,
            datt: exec.empty(&[tokens, dq])?,
            dq: exec.empty(&[tokens, dq])?,
            dk: exec.empty(&[tokens, dkv])?,
            dv: exec.empty(&[tokens, dkv])?,
            dw_sink: exec.empty(&[d])?,
        })
    }
}

/// The window of `grads` that `pick` names, or `sink` for a frozen block.
fn norm_grad<'a>(
    grads: Option<&'a mut BlockGrads<'_>>,
    pick: fn(&BlockParams<Range<usize>>) -> &Range<usize>,
    sink: &'a mut Tensor<f32>,
) -> Result<BufferViewMut<'a, f32>> {
    match grads {
        Some(grads) => grads.win(pick),
        None => Ok(sink.view_mut()),
    }
}

/// The window of `grads` that `pick` names (None for a frozen block).
fn weight_grad<'a>(
    grads: &'a mut Option<BlockGrads<'_>>,
    pick: fn(&BlockParams<Range<usize>>) -> &Range<usize>,
) -> Result<Option<BufferViewMut<'a, f32>>> {
    grads.as_mut().map(|grads| grads.win(pick)).transpose()
}

/// Backward of [`block_forward`](super::block::block_forward): from `dout[T,D]` OVERWRITES
/// `dinput[T,D]` and accumulates the weight gradients into `grads` (None: a frozen block,
/// only `dinput` is computed).
#[allow(clippy::too_many_arguments)]
pub fn block_backward<A: ActElem>(
    stream: &Stream,
    ctx: &BlockCtx,
    weights: &BlockWeights,
    mut grads: Option<BlockGrads>,
    acts: BlockRefs<'_, A>,
    scratch: &mut BwdScratch<A>,
    input: &BufferView<'_, f32>,
    dout: &BufferView<'_, f32>,
    dinput: &mut BufferViewMut<'_, f32>,
) -> ModelResult<()> {
    let dims = ctx.dims;
    let (dm, dq, dkv, di) = (dims.d, dims.dq(), dims.dkv(), dims.inter);
    // out = mid + h Wdown^T
    scratch.dh.zero(stream)?;
    let gw = weight_grad(&mut grads, |r| &r.down)?;
    linear_back(
        stream,
        Some(scratch.dh.view_mut()),
        gw,
        dout,
        &acts.h.view(),
        &weights.down,
        di,
        dm,
    )?;
    // h = act(gate) * up;  gate, up = ln2 Wgate^T, ln2 Wup^T
    let saved = (acts.gate, acts.up, &scratch.dh);
    gated_backward(
        stream,
        dims.act,
        saved,
        &mut scratch.dgate,
        &mut scratch.dup,
        scratch.tmp.as_mut(),
    )?;
    scratch.dn.zero(stream)?;
    let ln2 = acts.ln2.view();
    let gw = weight_grad(&mut grads, |r| &r.gate)?;
    linear_back(
        stream,
        Some(scratch.dn.view_mut()),
        gw,
        &scratch.dgate.view(),
        &ln2,
        &weights.gate,
        dm,
        di,
    )?;
    let gw = weight_grad(&mut grads, |r| &r.up)?;
    linear_back(
        stream,
        Some(scratch.dn.view_mut()),
        gw,
        &scratch.dup.view(),
        &ln2,
        &weights.up,
        dm,
        di,
    )?;
    // ln2 = rmsnorm(mid)
    copy(stream, &mut scratch.dmid.view_mut(), dout)?;
    let mut gw = norm_grad(grads.as_mut(), |r| &r.mlp_norm, &mut scratch.dw_sink)?;
    let (dn, mid, rstd2) = (scratch.dn.view(), acts.mid.view(), acts.rstd2.view());
    let mut dmid = scratch.dmid.view_mut();
    ops::rmsnorm_backward(
        stream,
        &mut dmid,
        &mut gw,
        &dn,
        &mid,
        &weights.mlp_norm,
        &rstd2,
        dm,
    )?;

    // mid = x + att Wo^T
    scratch.datt32.zero(stream)?;
    let gw = weight_grad(&mut grads, |r| &r.o)?;
    let dmid = scratch.dmid.view();
    linear_back(
        stream,
        Some(scratch.datt32.view_mut()),
        gw,
        &dmid,
        &acts.att.view(),
        &weights.o,
        dq,
        dm,
    )?;
    store(stream, &scratch.datt32.view(), &mut scratch.datt.view_mut())?;
    // att = attention(rope(q), rope(k), v)
    let (mut gq, mut gk, mut gv) = (
        scratch.dq.view_mut(),
        scratch.dk.view_mut(),
        scratch.dv.view_mut(),
    );
    let saved = AttnRefs {
        q: acts.q,
        k: acts.k,
        v: acts.v,
        att: acts.att,
        lse: acts.lse,
        att_cp: acts.att_cp,
    };
    let qkv_grads = QkvGradBuf {
        dq: &mut gq,
        dk: &mut gk,
        dv: &mut gv,
    };
    ctx.attention
        .backward(stream, &dims.attn(), saved, &scratch.datt.view(), qkv_grads)?;
    ops::rope_backward(
        stream,
        &mut scratch.dq.view_mut(),
        dims.q_heads,
        ctx.rope,
        ctx.pos,
    )?;
    ops::rope_backward(
        stream,
        &mut scratch.dk.view_mut(),
        dims.kv_heads,
        ctx.rope,
        ctx.pos,
    )?;
    // q, k, v = ln1 W^T
    scratch.dn.zero(stream)?;
    let ln1 = acts.ln1.view();
    let gw = weight_grad(&mut grads, |r| &r.q)?;
    linear_back(
        stream,
        Some(scratch.dn.view_mut()),
        gw,
        &scratch.dq.view(),
        &ln1,
        &weights.q,
        dm,
        dq,
    )?;
    let gw = weight_grad(&mut grads, |r| &r.k)?;
    linear_back(
        stream,
        Some(scratch.dn.view_mut()),
        gw,
        &scratch.dk.view(),
        &ln1,
        &weights.k,
        dm,
        dkv,
    )?;
    let gw = weight_grad(&mut grads, |r| &r.v)?;
    linear_back(
        stream,
        Some(scratch.dn.view_mut()),
        gw,
        &scratch.dv.view(),
        &ln1,
        &weights.v,
        dm,
        dkv,
    )?;
    // ln1 = rmsnorm(x)
    copy(stream, dinput, &scratch.dmid.view())?;
    let mut gw = norm_grad(grads.as_mut(), |r| &r.attn_norm, &mut scratch.dw_sink)?;
    let (dn, rstd1) = (scratch.dn.view(), acts.rstd1.view());
    Ok(ops::rmsnorm_backward(
        stream,
        dinput,
        &mut gw,
        &dn,
        input,
        &weights.attn_norm,
        &rstd1,
        dm,
    )?)
}
