//! A block's attention, the one seam between the block and the way the sequence is spread:
//! [`SeqAttention::Local`] runs the varlen kernel on every token of the batch (the vision
//! tower, a decoder without context parallelism); [`SeqAttention::Group`] runs it across a CP
//! group: the Ulysses exchange around the attention of the ring rank's tokens (the varlen
//! kernel when there is no ring, [`ring`] otherwise). Forward and backward side by side.
//!
//! ```text
//! forward   q [Tl, Hq, Hd], k, v [Tl, Hkv, Hd]  (f32, after RoPE, this rank's tokens)
//!           kv heads repeated rep = max(1, u / Hkv) times           -> [Tl, Hkv*rep, Hd]
//!           to_heads (all-to-all over the Ulysses group)            -> [2C, H/u, Hd]
//!           attention over the 2C tokens of the ring rank           -> out [2C, Hq/u, Hd],
//!                                                                      lse [2C, Hq/u]
//!           from_heads (all-to-all back)                            -> att [Tl, Hq, Hd]
//! backward  d att [Tl, Hq, Hd] -> to_heads -> attention backward -> dq, dk, dv [2C, H/u, Hd]
//!           -> from_heads (the rep copies of a kv head summed)      -> [Tl, H, Hd]
//! ```
//!
//! With `u = 1` the exchange is the identity and costs no call. What the forward saves
//! ([`AttnSaved`]): q, k, v and lse in the layout the backward reads (head-sharded under CP),
//! the attention output in this rank's token layout (`att`, for the output projection) and,
//! under CP, once more head-sharded (`att_cp`, for the attention backward).
//!
//! [`ring`]: super::ring

use super::error::{CpError, Result};
use super::{ring, CpGroup, CpLayout};
use cannon_kernels::attention::{QkvBuf, QkvGradBuf, VarlenAttention};
use cannon_kernels::device_ctx::DeviceCtx;
use cannon_kernels::{ops, Tensor};
use cannon_runtime::comm::Communicator;
use cannon_runtime::{BufferView, BufferViewMut, Float, Stream};

/// The head counts and mask of a block's attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnDims {
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub causal: bool,
}

/// How a block's attention sees the sequence.
#[derive(Clone, Copy, Debug)]
pub enum SeqAttention<'a> {
    /// Every token is on this rank: sequences end at `cu_seqlens` (cumulative, no leading 0:
    /// images in the vision tower, packed sequences in the decoder; the last end is the
    /// token count).
    Local { cu_seqlens: &'a [usize] },
    /// This rank holds a shard of the tokens and exchanges them with its CP group.
    Group(CpCtx<'a>),
}

/// What attention's forward writes, borrowed from the block's saved tensors.
#[derive(Debug)]
pub struct AttnSaved<'a, A: cannon_runtime::Element> {
    pub q: &'a mut Tensor<A>,
    pub k: &'a mut Tensor<A>,
    pub v: &'a mut Tensor<A>,
    /// This rank's tokens, for the output projection.
    pub att: &'a mut Tensor<A>,
    pub lse: &'a mut Tensor<f32>,
    /// Under CP the output once more, head-sharded.
    pub att_cp: Option<&'a mut Tensor<A>>,
}

/// What attention's backward reads of the forward's [`AttnSaved`].
#[derive(Clone, Copy, Debug)]
pub struct AttnRefs<'a, A: cannon_runtime::Element> {
    pub q: &'a Tensor<A>,
    pub k: &'a Tensor<A>,
    pub v: &'a Tensor<A>,
    pub att: &'a Tensor<A>,
    pub lse: &'a Tensor<f32>,
    pub att_cp: Option<&'a Tensor<A>>,
}

impl SeqAttention<'_> {
    /// Forward from the f32 RoPE'd `q [Tl, Hq*Hd]`, `k`, `v [Tl, Hkv*Hd]` (this rank's
    /// tokens): fills every tensor of `s`.
    pub fn forward<A: Float>(
        &self,
        st: &Stream,
        dims: &AttnDims,
        qkv: (&Tensor<f32>, &Tensor<f32>, &Tensor<f32>),
        s: AttnSaved<'_, A>,
    ) -> Result<()> {
        let cu_seqlens = match *self {
            SeqAttention::Group(cx) => return group_forward(cx, dims, qkv, s),
            SeqAttention::Local { cu_seqlens } => cu_seqlens,
        };
        let (q, k, v) = qkv;
        ops::cast(st, &q.view(), &mut s.q.view_mut())?;
        ops::cast(st, &k.view(), &mut s.k.view_mut())?;
        ops::cast(st, &v.view(), &mut s.v.view_mut())?;
        let (q, k, v) = (s.q.view(), s.k.view(), s.v.view());
        let qkv = QkvBuf {
            q: &q,
            k: &k,
            v: &v,
        };
        let tokens = cu_seqlens.last().copied().unwrap_or(0);
        let a = varlen(cu_seqlens, tokens, dims.q_heads, dims.kv_heads, dims);
        let (mut att, mut lse) = (s.att.view_mut(), s.lse.view_mut());
        Ok(ops::attention_forward(st, &a, qkv, &mut att, &mut lse)?)
    }

    /// Backward of [`SeqAttention::forward`]: from `datt [Tl, Hq*Hd]` (this rank's tokens)
    /// OVERWRITES `dq [Tl, Hq*Hd]`, `dk`, `dv [Tl, Hkv*Hd]` (before the RoPE backward).
    pub fn backward<A: Float>(
        &self,
        st: &Stream,
        dims: &AttnDims,
        s: AttnRefs<'_, A>,
        datt: &BufferView<'_, A>,
        grads: QkvGradBuf<'_, '_, A>,
    ) -> Result<()> {
        let cu_seqlens = match *self {
            SeqAttention::Group(cx) => return group_backward(cx, dims, s, datt, grads),
            SeqAttention::Local { cu_seqlens } => cu_seqlens,
        };
        let (q, k, v) = (s.q.view(), s.k.view(), s.v.view());
        let qkv = QkvBuf {
            q: &q,
            k: &k,
            v: &v,
        };
        let tokens = cu_seqlens.last().copied().unwrap_or(0);
        let a = varlen(cu_seqlens, tokens, dims.q_heads, dims.kv_heads, dims);
        let (att, lse) = (s.att.view(), s.lse.view());
        Ok(ops::attention_backward(
            st, &a, qkv, &att, &lse, datt, grads,
        )?)
    }
}

fn varlen<'a>(
    ends: &'a [usize],
    tokens: usize,
    q_heads: usize,
    kv_heads: usize,
    dims: &AttnDims,
) -> VarlenAttention<'a> {
    VarlenAttention::new(ends, tokens, q_heads, kv_heads, dims.head_dim, dims.causal)
}

/// What a block needs under CP: where to allocate, the group, and the batch's layout.
#[derive(Clone, Copy, Debug)]
pub struct CpCtx<'a> {
    pub exec: &'a DeviceCtx,
    pub group: &'a CpGroup,
    pub layout: &'a CpLayout,
}

/// `[Tl, h, d]` (this rank's tokens, every head; each head repeated `rep` times) to
/// `[u Tl, h rep / u, d]` (the Ulysses group's tokens, this rank's heads).
fn to_heads<T: Float>(
    exec: &DeviceCtx,
    comm: Option<&Communicator>,
    x: &BufferView<'_, T>,
    (tl, h, d, rep): (usize, usize, usize, usize),
) -> Result<Tensor<T>> {
    let st = exec.stream();
    let u = comm.map_or(1, Communicator::world_size);
    let hc = h * rep / u;
    // Send row (j, t, hh) of [u, Tl, hc] (rows of d): token t's head j*hc + hh (repeated).
    let idx: Vec<usize> = (0..u)
        .flat_map(|j| (0..tl).flat_map(move |t| (0..hc).map(move |hh| t * h + (j * hc + hh) / rep)))
        .collect();
    let mut send = exec.empty::<T>(&[u * tl, hc * d])?;
    ops::gather_rows(st, &mut send.view_mut(), x, &idx, d)?;
    let Some(comm) = comm else {
        return Ok(send);
    };
    let mut recv = exec.empty::<T>(&[u * tl, hc * d])?;
    comm.all_to_all(&send.view(), &mut recv.view_mut(), st)?;
    Ok(recv)
}

/// Inverse (adjoint) of [`to_heads`]: `[u Tl, h rep / u, d]` back to `[Tl, h, d]`, the
/// `rep` copies of a head summed.
fn from_heads<T: Float>(
    exec: &DeviceCtx,
    comm: Option<&Communicator>,
    y: &BufferView<'_, T>,
    (tl, h, d, rep): (usize, usize, usize, usize),
) -> Result<Tensor<T>> {
    let st = exec.stream();
    let u = comm.map_or(1, Communicator::world_size);
    let (he, hc) = (h * rep, h * rep / u);
    let recv = match comm {
        Some(comm) => {
            let mut recv = exec.empty::<T>(&[u * tl, hc * d])?;
            comm.all_to_all(y, &mut recv.view_mut(), st)?;
            Some(recv)
        }
        None => None,
    };
    let recv_view = recv.as_ref().map(Tensor::view);
    let src = recv_view.as_ref().unwrap_or(y);
    // Recv chunk j = [Tl, hc] of rank j's heads: token t's expanded head e = j*hc + hh.
    let at = |t: usize, e: usize| ((e / hc) * tl + t) * hc + e % hc;
    let mut out = exec.empty::<T>(&[tl, h * d])?;
    if rep == 1 {
        let idx: Vec<usize> = (0..tl)
            .flat_map(|t| (0..he).map(move |e| at(t, e)))
            .collect();
        ops::gather_rows(st, &mut out.view_mut(), src, &idx, d)?;
    } else {
        let mut expanded = exec.empty::<T>(&[tl, he * d])?;
        let idx: Vec<usize> = (0..tl)
            .flat_map(|t| (0..he).map(move |e| at(t, e)))
            .collect();
        ops::gather_rows(st, &mut expanded.view_mut(), src, &idx, d)?;
        out.zero(st)?;
        let to: Vec<usize> = (0..tl)
            .flat_map(|t| (0..he).map(move |e| t * h + e / rep))
            .collect();
        ops::scatter_add_rows(st, &mut out.view_mut(), &expanded.view(), &to, d)?;
    }
    Ok(out)
}

/// [`SeqAttention::forward`] across the CP group: `a.q`, `a.k`, `a.v`, `a.lse`, `a.att_cp`
/// head-sharded, `a.att` this rank's tokens.
fn group_forward<A: Float>(
    cx: CpCtx<'_>,
    dims: &AttnDims,
    (q, k, v): (&Tensor<f32>, &Tensor<f32>, &Tensor<f32>),
    a: AttnSaved<'_, A>,
) -> Result<()> {
    let (exec, layout) = (cx.exec, cx.layout);
    let st = exec.stream();
    let sh = layout.shapes(dims.q_heads, dims.kv_heads);
    let (tl, hd) = (layout.local_tokens(), dims.head_dim);
    let comm = cx.group.ulysses.as_ref();
    let qh = to_heads(exec, comm, &q.view(), (tl, dims.q_heads, hd, 1))?;
    let kh = to_heads(exec, comm, &k.view(), (tl, dims.kv_heads, hd, sh.rep))?;
    let vh = to_heads(exec, comm, &v.view(), (tl, dims.kv_heads, hd, sh.rep))?;
    ops::cast(st, &qh.view(), &mut a.q.view_mut())?;
    ops::cast(st, &kh.view(), &mut a.k.view_mut())?;
    ops::cast(st, &vh.view(), &mut a.v.view_mut())?;
    drop((qh, kh, vh));
    let att_cp = a.att_cp.ok_or_else(missing_att_cp)?;
    if layout.r == 1 {
        let ends = layout.ring_local_ends();
        let va = varlen(&ends, sh.tokens, sh.q_heads, sh.kv_heads, dims);
        let (qv, kv, vv) = (a.q.view(), a.k.view(), a.v.view());
        let qkv = QkvBuf {
            q: &qv,
            k: &kv,
            v: &vv,
        };
        ops::attention_forward(st, &va, qkv, &mut att_cp.view_mut(), &mut a.lse.view_mut())?;
    } else {
        let ring = cx.group.ring.as_ref().ok_or_else(missing_ring)?;
        let out = ring::forward(exec, ring, layout, &sh, hd, (&*a.q, &*a.k, &*a.v), a.lse)?;
        ops::cast(st, &out.view(), &mut att_cp.view_mut())?;
    }
    let att = from_heads(exec, comm, &att_cp.view(), (tl, dims.q_heads, hd, 1))?;
    a.att.view_mut().memcpy_dtod(st, &att.view())?;
    Ok(())
}

/// [`SeqAttention::backward`] across the CP group.
fn group_backward<A: Float>(
    cx: CpCtx<'_>,
    dims: &AttnDims,
    a: AttnRefs<'_, A>,
    datt: &BufferView<'_, A>,
    grads: QkvGradBuf<'_, '_, A>,
) -> Result<()> {
    let (exec, layout) = (cx.exec, cx.layout);
    let st = exec.stream();
    let sh = layout.shapes(dims.q_heads, dims.kv_heads);
    let (tl, hd) = (layout.local_tokens(), dims.head_dim);
    let comm = cx.group.ulysses.as_ref();
    let att_cp = a.att_cp.ok_or_else(missing_att_cp)?;
    let dout = to_heads(exec, comm, datt, (tl, dims.q_heads, hd, 1))?;
    let (qv, kv, vv) = (a.q.view(), a.k.view(), a.v.view());
    let qkv = QkvBuf {
        q: &qv,
        k: &kv,
        v: &vv,
    };
    let mut dqh = exec.empty::<A>(a.q.shape())?;
    let mut dkh = exec.empty::<A>(a.k.shape())?;
    let mut dvh = exec.empty::<A>(a.v.shape())?;
    if layout.r == 1 {
        let ends = layout.ring_local_ends();
        let va = varlen(&ends, sh.tokens, sh.q_heads, sh.kv_heads, dims);
        let (mut gq, mut gk, mut gv) = (dqh.view_mut(), dkh.view_mut(), dvh.view_mut());
        let grads = QkvGradBuf {
            dq: &mut gq,
            dk: &mut gk,
            dv: &mut gv,
        };
        let (att, lse) = (att_cp.view(), a.lse.view());
        ops::attention_backward(st, &va, qkv, &att, &lse, &dout.view(), grads)?;
    } else {
        let ring = cx.group.ring.as_ref().ok_or_else(missing_ring)?;
        let saved = (&att_cp.view(), &a.lse.view(), &dout.view());
        let (gq, gk, gv) = ring::backward(exec, ring, layout, &sh, hd, qkv, saved)?;
        ops::cast(st, &gq.view(), &mut dqh.view_mut())?;
        ops::cast(st, &gk.view(), &mut dkh.view_mut())?;
        ops::cast(st, &gv.view(), &mut dvh.view_mut())?;
    }
    drop(dout);
    let back = |x: &Tensor<A>, h: usize, rep: usize, dst: &mut BufferViewMut<'_, A>| {
        let y = from_heads(exec, comm, &x.view(), (tl, h, hd, rep))?;
        dst.memcpy_dtod(st, &y.view())?;
        Ok::<(), CpError>(())
    };
    back(&dqh, dims.q_heads, 1, grads.dq)?;
    back(&dkh, dims.kv_heads, sh.rep, grads.dk)?;
    back(&dvh, dims.kv_heads, sh.rep, grads.dv)?;
    Ok(())
}

fn missing_att_cp() -> CpError {
    CpError::Input("a CP block's activations lack the head-sharded attention output".into())
}

fn missing_ring() -> CpError {
    CpError::Input("the CP layout has a ring but this rank has no ring communicator".into())
}
