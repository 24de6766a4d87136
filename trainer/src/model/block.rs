//! One pre-norm transformer block, shared by Pixtral and Mistral (they differ only in sizes,
//! the attention mask, the RoPE table and the MLP gate activation), on `cannon_kernels`
//! device-level ops:
//!
//! ```text
//! ln1 = rmsnorm(x)                                   [T,D]        x: the f32 residual
//! q,k,v = ln1 Wq^T, ln1 Wk^T, ln1 Wv^T; rope(q,k)    [T,Hq*Hd], [T,Hkv*Hd]
//! att = attention(q,k,v)   (varlen TND, GQA)         [T,Hq*Hd]    + lse [T,Hq]
//! mid = x + att Wo^T                                 [T,D]
//! ln2 = rmsnorm(mid)
//! h = act(ln2 Wgate^T) * (ln2 Wup^T)                 [T,I]
//! out = mid + h Wdown^T                              [T,D]
//! ```
//!
//! Forward saves what backward needs in [`BlockActs`] (device tensors): the inputs of GEMMs
//! and of the attention in activation storage `A` (bf16 in a bf16 run), GEMM outputs,
//! residuals and norm statistics in f32. [`block_backward`] is the same list read bottom-up.
//! The f32 working tensors of a pass ([`FwdScratch`], [`BwdScratch`]) are sized for T tokens
//! and reused layer after layer; `memory` sizes all of them.

use super::config::HiddenAct;
use super::ops::{add_into, copy, linear, linear_back, store, Act};
use super::params::GroupGrad;
use super::ModelError;
use crate::cp::attn::{AttnDims, AttnRefs, AttnSaved, SeqAttention};
use crate::cp::layout::CpShapes;
use cannon_kernels::attention::QkvGradBuf;
use cannon_kernels::exec::Exec;
use cannon_kernels::rope::RopeTable;
use cannon_kernels::{ops, KernelError, Tensor};
use cannon_runtime::{BufferView, BufferViewMut, Stream};
use std::ops::Range;

type Result<T> = std::result::Result<T, KernelError>;
type ModelResult<T> = std::result::Result<T, ModelError>;

/// The sizes and flavour of a block.
#[derive(Clone, Copy, Debug)]
pub struct BlockDims {
    pub d: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub inter: usize,
    pub causal: bool,
    pub act: HiddenAct,
    pub eps: f32,
}

impl BlockDims {
    pub fn dq(&self) -> usize {
        self.q_heads * self.head_dim
    }

    pub fn dkv(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// The attention's part of the sizes.
    pub fn attn(&self) -> AttnDims {
        AttnDims {
            q_heads: self.q_heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            causal: self.causal,
        }
    }
}

/// A block's nine tensors: weights (`BufferView`s into the layer's group) or their element
/// ranges in the group (`Range<usize>`, to window the gradient); shapes `[out, in]`.
#[derive(Clone, Debug)]
pub struct BlockParams<T> {
    pub attn_norm: T,
    pub q: T,
    pub k: T,
    pub v: T,
    pub o: T,
    pub mlp_norm: T,
    pub gate: T,
    pub up: T,
    pub down: T,
}

/// A block's weights.
pub type BlockWeights<'a> = BlockParams<BufferView<'a, f32>>;

/// A block's gradient group (accumulated into), windowed per tensor.
pub type BlockGrads<'a> = GroupGrad<'a, BlockParams<Range<usize>>>;

/// What the forward of one block saves for T tokens (the block input `x` is the caller's).
#[derive(Debug)]
pub struct BlockActs<A: cannon_runtime::Element> {
    pub rstd1: Tensor<f32>, // [T]
    pub ln1: Tensor<A>,     // [T,D]
    pub q: Tensor<A>,       // [T,Hq*Hd] after RoPE
    pub k: Tensor<A>,       // [T,Hkv*Hd] after RoPE
    pub v: Tensor<A>,       // [T,Hkv*Hd]
    pub att: Tensor<A>,     // [T,Hq*Hd]
    pub lse: Tensor<f32>,   // [T,Hq] (CPU) or [T,Hq,16] (NPU)
    pub mid: Tensor<f32>,   // [T,D]
    pub rstd2: Tensor<f32>, // [T]
    pub ln2: Tensor<A>,     // [T,D]
    pub gate: Tensor<f32>,  // [T,I]
    pub up: Tensor<f32>,    // [T,I]
    pub h: Tensor<A>,       // [T,I]
    /// Under context parallelism (`crate::cp`) q, k, v and lse hold the head-sharded layout
    /// (`[2C, H/u, Hd]`, the ring rank's tokens) and this the attention output in it.
    pub att_cp: Option<Tensor<A>>,
}

impl<A: Act> BlockActs<A> {
    /// Tensors for `t` tokens, planned from the sizes (the forward overwrites all of them).
    pub fn new(exec: &Exec, dims: &BlockDims, t: usize) -> Result<Self> {
        let (d, dq, dkv, i) = (dims.d, dims.dq(), dims.dkv(), dims.inter);
        Ok(BlockActs {
            rstd1: exec.empty(&[t])?,
            ln1: exec.empty(&[t, d])?,
            q: exec.empty(&[t, dq])?,
            k: exec.empty(&[t, dkv])?,
            v: exec.empty(&[t, dkv])?,
            att: exec.empty(&[t, dq])?,
            // [T, Hq] on the CPU; the NPU keeps softmaxMax + softmaxSum ([T, Hq, 8] each).
            lse: exec.empty(&[
                t,
                dims.q_heads,
                cannon_kernels::attention::lse_per_head(exec.device()),
            ])?,
            mid: exec.empty(&[t, d])?,
            rstd2: exec.empty(&[t])?,
            ln2: exec.empty(&[t, d])?,
            gate: exec.empty(&[t, i])?,
            up: exec.empty(&[t, i])?,
            h: exec.empty(&[t, i])?,
            att_cp: None,
        })
    }

    /// Tensors for `t` tokens of a block run in `c`: [`Self::new`], or under context
    /// parallelism [`Self::new_cp`] (the same shapes as the forward's on every recompute).
    pub fn for_ctx(exec: &Exec, c: &BlockCtx, t: usize) -> Result<Self> {
        match c.attention {
            SeqAttention::Group(cx) => {
                let sh = cx.layout.shapes(c.dims.q_heads, c.dims.kv_heads);
                Self::new_cp(exec, &c.dims, t, &sh)
            }
            SeqAttention::Local { .. } => Self::new(exec, &c.dims, t),
        }
    }

    /// Tensors for the `t` tokens of a CP rank: q, k, v, lse in the head-sharded layout of
    /// `sh` (see [`crate::cp::attn`]), plus `att_cp`.
    pub fn new_cp(exec: &Exec, dims: &BlockDims, t: usize, sh: &CpShapes) -> Result<Self> {
        let hd = dims.head_dim;
        let mut a = Self::new(exec, dims, t)?;
        a.q = exec.empty(&[sh.tokens, sh.q_heads * hd])?;
        a.k = exec.empty(&[sh.tokens, sh.kv_heads * hd])?;
        a.v = exec.empty(&[sh.tokens, sh.kv_heads * hd])?;
        a.lse = exec.empty(&[
            sh.tokens,
            sh.q_heads,
            cannon_kernels::attention::lse_per_head(exec.device()),
        ])?;
        a.att_cp = Some(exec.empty(&[sh.tokens, sh.q_heads * hd])?);
        Ok(a)
    }
}

/// The saved tensors a block's backward reads, borrowed: from a [`BlockActs`] that kept all of
/// them, or from wherever recompute and offload put each one (`super::saved`).
#[derive(Clone, Copy, Debug)]
pub struct BlockRefs<'a, A: cannon_runtime::Element> {
    pub rstd1: &'a Tensor<f32>,
    pub ln1: &'a Tensor<A>,
    pub q: &'a Tensor<A>,
    pub k: &'a Tensor<A>,
    pub v: &'a Tensor<A>,
    pub att: &'a Tensor<A>,
    pub lse: &'a Tensor<f32>,
    pub mid: &'a Tensor<f32>,
    pub rstd2: &'a Tensor<f32>,
    pub ln2: &'a Tensor<A>,
    pub gate: &'a Tensor<f32>,
    pub up: &'a Tensor<f32>,
    pub h: &'a Tensor<A>,
    /// Under context parallelism: the attention output in the head-sharded layout.
    pub att_cp: Option<&'a Tensor<A>>,
}

impl<A: Act> BlockActs<A> {
    pub fn refs(&self) -> BlockRefs<'_, A> {
        BlockRefs {
            rstd1: &self.rstd1,
            ln1: &self.ln1,
            q: &self.q,
            k: &self.k,
            v: &self.v,
            att: &self.att,
            lse: &self.lse,
            mid: &self.mid,
            rstd2: &self.rstd2,
            ln2: &self.ln2,
            gate: &self.gate,
            up: &self.up,
            h: &self.h,
            att_cp: self.att_cp.as_ref(),
        }
    }
}

/// What a block's position-dependent parts need: the RoPE table with each token's slot, and
/// how its attention sees the sequence (host data, by the kernels' convention).
#[derive(Clone, Copy, Debug)]
pub struct BlockCtx<'a> {
    pub dims: BlockDims,
    pub rope: &'a RopeTable,
    /// `[T]` RoPE table slot of every token.
    pub pos: &'a [u32],
    /// This rank's tokens only, or across its context-parallel group (`crate::cp`).
    pub attention: SeqAttention<'a>,
}

/// f32 working tensors of the forward, sized for T tokens and reused by every layer.
#[derive(Debug)]
pub struct FwdScratch {
    n: Tensor<f32>,           // [T,D]     norm output before storage
    q: Tensor<f32>,           // [T,Hq*Hd]
    k: Tensor<f32>,           // [T,Hkv*Hd]
    v: Tensor<f32>,           // [T,Hkv*Hd]
    h: Tensor<f32>,           // [T,I]     h before storage
    tmp: Option<Tensor<f32>>, // [T,I]     gelu(gate), GELU gate only
}

impl FwdScratch {
    pub fn new(exec: &Exec, dims: &BlockDims, t: usize) -> Result<Self> {
        let (d, dq, dkv, i) = (dims.d, dims.dq(), dims.dkv(), dims.inter);
        Ok(FwdScratch {
            n: exec.empty(&[t, d])?,
            q: exec.empty(&[t, dq])?,
            k: exec.empty(&[t, dkv])?,
            v: exec.empty(&[t, dkv])?,
            h: exec.empty(&[t, i])?,
            tmp: gelu_tmp(exec, dims, t)?,
        })
    }
}

fn gelu_tmp(exec: &Exec, dims: &BlockDims, t: usize) -> Result<Option<Tensor<f32>>> {
    match dims.act {
        HiddenAct::Gelu => Ok(Some(exec.empty(&[t, dims.inter])?)),
        HiddenAct::Silu => Ok(None),
    }
}

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

impl<A: Act> BwdScratch<A> {
    pub fn new(exec: &Exec, dims: &BlockDims, t: usize) -> Result<Self> {
        let (d, dq, dkv, i) = (dims.d, dims.dq(), dims.dkv(), dims.inter);
        Ok(BwdScratch {
            dn: exec.empty(&[t, d])?,
            dmid: exec.empty(&[t, d])?,
            datt32: exec.empty(&[t, dq])?,
            dh: exec.empty(&[t, i])?,
            dgate: exec.empty(&[t, i])?,
            dup: exec.empty(&[t, i])?,
            tmp: gelu_tmp(exec, dims, t)?,
            datt: exec.empty(&[t, dq])?,
            dq: exec.empty(&[t, dq])?,
            dk: exec.empty(&[t, dkv])?,
            dv: exec.empty(&[t, dkv])?,
            dw_sink: exec.empty(&[d])?,
        })
    }
}

fn missing_tmp() -> KernelError {
    KernelError::InvalidArgument {
        op: "block",
        detail: "GELU gate without its scratch tensor".into(),
    }
}

/// `out[T,D] = block(x[T,D])`, saving activations in `a`.
pub fn block_forward<A: Act>(
    st: &Stream,
    c: &BlockCtx,
    w: &BlockWeights,
    a: &mut BlockActs<A>,
    s: &mut FwdScratch,
    x: &BufferView<'_, f32>,
    out: &mut BufferViewMut<'_, f32>,
) -> ModelResult<()> {
    let d = c.dims;
    let (dm, dq, dkv) = (d.d, d.dq(), d.dkv());
    norm_store(st, &d, s, x, &w.attn_norm, &mut a.rstd1, &mut a.ln1)?;
    let ln1 = a.ln1.view();
    linear(st, &mut s.q.view_mut(), &ln1, &w.q, dm, dq)?;
    linear(st, &mut s.k.view_mut(), &ln1, &w.k, dm, dkv)?;
    linear(st, &mut s.v.view_mut(), &ln1, &w.v, dm, dkv)?;
    ops::rope_forward(st, &mut s.q.view_mut(), d.q_heads, c.rope, c.pos)?;
    ops::rope_forward(st, &mut s.k.view_mut(), d.kv_heads, c.rope, c.pos)?;
    let saved = AttnSaved {
        q: &mut a.q,
        k: &mut a.k,
        v: &mut a.v,
        att: &mut a.att,
        lse: &mut a.lse,
        att_cp: a.att_cp.as_mut(),
    };
    c.attention
        .forward(st, &d.attn(), (&s.q, &s.k, &s.v), saved)?;
    linear(st, &mut a.mid.view_mut(), &a.att.view(), &w.o, dq, dm)?;
    add_into(st, &mut a.mid.view_mut(), x)?;

    norm_store(
        st,
        &d,
        s,
        &a.mid.view(),
        &w.mlp_norm,
        &mut a.rstd2,
        &mut a.ln2,
    )?;
    let ln2 = a.ln2.view();
    linear(st, &mut a.gate.view_mut(), &ln2, &w.gate, dm, d.inter)?;
    linear(st, &mut a.up.view_mut(), &ln2, &w.up, dm, d.inter)?;
    gated_store(st, &d, s, &a.gate, &a.up, &mut a.h)?;
    linear(st, out, &a.h.view(), &w.down, d.inter, dm)?;
    Ok(add_into(st, out, &a.mid.view())?)
}

/// `ln = rmsnorm(x) w` in f32, stored as `A` (`rstd [T]`, `ln [T,D]`): the forward's two
/// norms, and what selective recompute makes again bit for bit (same kernel, same input).
pub fn norm_store<A: Act>(
    st: &Stream,
    d: &BlockDims,
    s: &mut FwdScratch,
    x: &BufferView<'_, f32>,
    w: &BufferView<'_, f32>,
    rstd: &mut Tensor<f32>,
    ln: &mut Tensor<A>,
) -> Result<()> {
    let mut r = rstd.view_mut();
    ops::rmsnorm_forward(st, &mut s.n.view_mut(), &mut r, x, w, d.d, d.eps)?;
    store(st, &s.n.view(), &mut ln.view_mut())
}

/// `h [T,I] = act(gate) * up` in f32, stored as `A` (the forward's, and selective recompute's).
pub fn gated_store<A: Act>(
    st: &Stream,
    d: &BlockDims,
    s: &mut FwdScratch,
    gate: &Tensor<f32>,
    up: &Tensor<f32>,
    h: &mut Tensor<A>,
) -> Result<()> {
    gated_forward(st, d.act, gate, up, &mut s.h, s.tmp.as_mut())?;
    store(st, &s.h.view(), &mut h.view_mut())
}

/// `h[T,I] = act(gate) * up` in f32 (overwrites h). SiLU is the swiglu kernel; the GELU gate
/// (Pixtral's default `hidden_act`) is the gelu kernel and an elementwise product.
fn gated_forward(
    st: &Stream,
    act: HiddenAct,
    gate: &Tensor<f32>,
    up: &Tensor<f32>,
    h: &mut Tensor<f32>,
    tmp: Option<&mut Tensor<f32>>,
) -> Result<()> {
    match act {
        HiddenAct::Silu => ops::swiglu_forward(st, &mut h.view_mut(), &gate.view(), &up.view()),
        HiddenAct::Gelu => {
            let tmp = tmp.ok_or_else(missing_tmp)?;
            ops::gelu_forward(st, &mut tmp.view_mut(), &gate.view())?;
            ops::mul(st, &mut h.view_mut(), &tmp.view(), &up.view())
        }
    }
}

/// Backward of [`gated_forward`]: OVERWRITES `dgate`, `dup` from `dh`.
fn gated_backward(
    st: &Stream,
    act: HiddenAct,
    (gate, up, dh): (&Tensor<f32>, &Tensor<f32>, &Tensor<f32>),
    dgate: &mut Tensor<f32>,
    dup: &mut Tensor<f32>,
    tmp: Option<&mut Tensor<f32>>,
) -> Result<()> {
    dgate.zero(st)?;
    match act {
        HiddenAct::Silu => {
            dup.zero(st)?;
            let (mut dg, mut du) = (dgate.view_mut(), dup.view_mut());
            ops::swiglu_backward(st, &mut dg, &mut du, &dh.view(), &gate.view(), &up.view())
        }
        HiddenAct::Gelu => {
            // d up = gelu(gate) dh;  d gate = gelu'(gate) (dh up)
            let tmp = tmp.ok_or_else(missing_tmp)?;
            ops::gelu_forward(st, &mut dup.view_mut(), &gate.view())?;
            ops::mul_into(st, &mut dup.view_mut(), &dh.view())?;
            ops::mul(st, &mut tmp.view_mut(), &dh.view(), &up.view())?;
            ops::gelu_backward(st, &mut dgate.view_mut(), &tmp.view(), &gate.view())
        }
    }
}

/// The window of `g` that `pick` names, or `sink` for a frozen block.
fn norm_grad<'a>(
    g: Option<&'a mut BlockGrads<'_>>,
    pick: fn(&BlockParams<Range<usize>>) -> &Range<usize>,
    sink: &'a mut Tensor<f32>,
) -> Result<BufferViewMut<'a, f32>> {
    match g {
        Some(g) => g.win(pick),
        None => Ok(sink.view_mut()),
    }
}

/// The window of `g` that `pick` names (None for a frozen block).
fn weight_grad<'a>(
    g: &'a mut Option<BlockGrads<'_>>,
    pick: fn(&BlockParams<Range<usize>>) -> &Range<usize>,
) -> Result<Option<BufferViewMut<'a, f32>>> {
    g.as_mut().map(|g| g.win(pick)).transpose()
}

/// Backward of [`block_forward`]: from `dout[T,D]` OVERWRITES `dx[T,D]` and accumulates the
/// weight gradients into `g` (None: a frozen block, only `dx` is computed).
#[allow(clippy::too_many_arguments)]
pub fn block_backward<A: Act>(
    st: &Stream,
    c: &BlockCtx,
    w: &BlockWeights,
    mut g: Option<BlockGrads>,
    a: BlockRefs<'_, A>,
    s: &mut BwdScratch<A>,
    x: &BufferView<'_, f32>,
    dout: &BufferView<'_, f32>,
    dx: &mut BufferViewMut<'_, f32>,
) -> ModelResult<()> {
    let d = c.dims;
    let (dm, dq, dkv, di) = (d.d, d.dq(), d.dkv(), d.inter);
    // out = mid + h Wdown^T
    s.dh.zero(st)?;
    let gw = weight_grad(&mut g, |r| &r.down)?;
    linear_back(
        st,
        Some(s.dh.view_mut()),
        gw,
        dout,
        &a.h.view(),
        &w.down,
        di,
        dm,
    )?;
    // h = act(gate) * up;  gate, up = ln2 Wgate^T, ln2 Wup^T
    let saved = (a.gate, a.up, &s.dh);
    gated_backward(st, d.act, saved, &mut s.dgate, &mut s.dup, s.tmp.as_mut())?;
    s.dn.zero(st)?;
    let ln2 = a.ln2.view();
    let gw = weight_grad(&mut g, |r| &r.gate)?;
    linear_back(
        st,
        Some(s.dn.view_mut()),
        gw,
        &s.dgate.view(),
        &ln2,
        &w.gate,
        dm,
        di,
    )?;
    let gw = weight_grad(&mut g, |r| &r.up)?;
    linear_back(
        st,
        Some(s.dn.view_mut()),
        gw,
        &s.dup.view(),
        &ln2,
        &w.up,
        dm,
        di,
    )?;
    // ln2 = rmsnorm(mid)
    copy(st, &mut s.dmid.view_mut(), dout)?;
    let mut gw = norm_grad(g.as_mut(), |r| &r.mlp_norm, &mut s.dw_sink)?;
    let (dn, mid, rstd2) = (s.dn.view(), a.mid.view(), a.rstd2.view());
    let mut dmid = s.dmid.view_mut();
    ops::rmsnorm_backward(st, &mut dmid, &mut gw, &dn, &mid, &w.mlp_norm, &rstd2, dm)?;

    // mid = x + att Wo^T
    s.datt32.zero(st)?;
    let gw = weight_grad(&mut g, |r| &r.o)?;
    let dmid = s.dmid.view();
    linear_back(
        st,
        Some(s.datt32.view_mut()),
        gw,
        &dmid,
        &a.att.view(),
        &w.o,
        dq,
        dm,
    )?;
    store(st, &s.datt32.view(), &mut s.datt.view_mut())?;
    // att = attention(rope(q), rope(k), v)
    let (mut gq, mut gk, mut gv) = (s.dq.view_mut(), s.dk.view_mut(), s.dv.view_mut());
    let saved = AttnRefs {
        q: a.q,
        k: a.k,
        v: a.v,
        att: a.att,
        lse: a.lse,
        att_cp: a.att_cp,
    };
    let grads = QkvGradBuf {
        dq: &mut gq,
        dk: &mut gk,
        dv: &mut gv,
    };
    c.attention
        .backward(st, &d.attn(), saved, &s.datt.view(), grads)?;
    ops::rope_backward(st, &mut s.dq.view_mut(), d.q_heads, c.rope, c.pos)?;
    ops::rope_backward(st, &mut s.dk.view_mut(), d.kv_heads, c.rope, c.pos)?;
    // q, k, v = ln1 W^T
    s.dn.zero(st)?;
    let ln1 = a.ln1.view();
    let gw = weight_grad(&mut g, |r| &r.q)?;
    linear_back(
        st,
        Some(s.dn.view_mut()),
        gw,
        &s.dq.view(),
        &ln1,
        &w.q,
        dm,
        dq,
    )?;
    let gw = weight_grad(&mut g, |r| &r.k)?;
    linear_back(
        st,
        Some(s.dn.view_mut()),
        gw,
        &s.dk.view(),
        &ln1,
        &w.k,
        dm,
        dkv,
    )?;
    let gw = weight_grad(&mut g, |r| &r.v)?;
    linear_back(
        st,
        Some(s.dn.view_mut()),
        gw,
        &s.dv.view(),
        &ln1,
        &w.v,
        dm,
        dkv,
    )?;
    // ln1 = rmsnorm(x)
    copy(st, dx, &s.dmid.view())?;
    let mut gw = norm_grad(g.as_mut(), |r| &r.attn_norm, &mut s.dw_sink)?;
    let (dn, rstd1) = (s.dn.view(), a.rstd1.view());
    Ok(ops::rmsnorm_backward(
        st,
        dx,
        &mut gw,
        &dn,
        x,
        &w.attn_norm,
        &rstd1,
        dm,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gated activations' backward against central differences of their forward, for both
    /// gates (the fixtures only exercise SiLU; Pixtral's class default is GELU). f32 central
    /// differences with step 1e-2 on O(1) inputs are good to ~1e-4 relative; the bar is 1e-3.
    #[test]
    fn gated_backward_matches_finite_differences() {
        let exec = Exec::cpu();
        let st = exec.stream();
        let n = 64;
        let val = |i: usize, k: f32| (i as f32 * k).sin() * 2.5;
        let gate: Vec<f32> = (0..n).map(|i| val(i, 0.37)).collect();
        let up: Vec<f32> = (0..n).map(|i| val(i, 0.71)).collect();
        let dh: Vec<f32> = (0..n).map(|i| val(i, 1.13)).collect();
        let t = |v: &[f32]| exec.upload(v, &[v.len()]).unwrap();
        let (gt, ut, dht) = (t(&gate), t(&up), t(&dh));
        for act in [HiddenAct::Silu, HiddenAct::Gelu] {
            let (mut dg, mut du, mut tmp) = (t(&[0.0; 64]), t(&[0.0; 64]), t(&[0.0; 64]));
            gated_backward(st, act, (&gt, &ut, &dht), &mut dg, &mut du, Some(&mut tmp)).unwrap();
            let (dg, du) = (dg.to_host(st).unwrap(), du.to_host(st).unwrap());
            let h = |g: f32, u: f32| {
                let (mut h, mut tmp) = (t(&[0.0]), t(&[0.0]));
                gated_forward(st, act, &t(&[g]), &t(&[u]), &mut h, Some(&mut tmp)).unwrap();
                h.to_host(st).unwrap()[0]
            };
            let eps = 1e-2;
            for i in 0..n {
                let fd_g = (h(gate[i] + eps, up[i]) - h(gate[i] - eps, up[i])) / (2.0 * eps);
                let fd_u = (h(gate[i], up[i] + eps) - h(gate[i], up[i] - eps)) / (2.0 * eps);
                for (got, want) in [(dg[i], dh[i] * fd_g), (du[i], dh[i] * fd_u)] {
                    let err = (got - want).abs() / want.abs().max(1.0);
                    assert!(err < 1e-3, "{act:?} {i}: {got} vs {want}");
                }
            }
        }
    }
}
