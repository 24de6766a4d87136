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
//! residuals and norm statistics in f32. The backward ([`super::block_backward`]) is the same
//! list read bottom-up. The f32 working tensors of a pass ([`FwdScratch`], and the backward's
//! [`BwdScratch`](super::block_backward::BwdScratch)) are sized for T tokens and reused layer
//! after layer; `memory` sizes all of them. The MLP's gated activation and its backward are
//! `model::gate`.

use super::config::HiddenAct;
use super::gate::gated_forward;
use super::grads::GroupGrad;
use super::precision::{add_into, linear, store, ActElem};
use super::ModelError;
use crate::parallel::cp::attn::{AttnDims, AttnSaved, SeqAttention};
use crate::parallel::cp::layout::CpShapes;
use cannon_kernels::device_ctx::DeviceCtx;
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
    /// Under context parallelism (`crate::parallel::cp`) q, k, v and lse hold the head-sharded layout
    /// (`[2C, H/u, Hd]`, the ring rank's tokens) and this the attention output in it.
    pub att_cp: Option<Tensor<A>>,
}

impl<A: ActElem> BlockActs<A> {
    /// Tensors for `tokens` tokens, planned from the sizes (the forward overwrites all of
    /// them).
    pub fn new(exec: &DeviceCtx, dims: &BlockDims, tokens: usize) -> Result<Self> {
        let (d, dq, dkv, i) = (dims.d, dims.dq(), dims.dkv(), dims.inter);
        Ok(BlockActs {
            rstd1: exec.empty(&[tokens])?,
            ln1: exec.empty(&[tokens, d])?,
            q: exec.empty(&[tokens, dq])?,
            k: exec.empty(&[tokens, dkv])?,
            v: exec.empty(&[tokens, dkv])?,
            att: exec.empty(&[tokens, dq])?,
            // [T, Hq] on the CPU; the NPU keeps softmaxMax + softmaxSum ([T, Hq, 8] each).
            lse: exec.empty(&[
                tokens,
                dims.q_heads,
                cannon_kernels::attention::lse_per_head(exec.device()),
            ])?,
            mid: exec.empty(&[tokens, d])?,
            rstd2: exec.empty(&[tokens])?,
            ln2: exec.empty(&[tokens, d])?,
            gate: exec.empty(&[tokens, i])?,
            up: exec.empty(&[tokens, i])?,
            h: exec.empty(&[tokens, i])?,
            att_cp: None,
        })
    }

    /// Tensors for `tokens` tokens of a block run in `ctx`: [`Self::new`], or under context
    /// parallelism [`Self::new_cp`] (the same shapes as the forward's on every recompute).
    pub fn for_ctx(exec: &DeviceCtx, ctx: &BlockCtx, tokens: usize) -> Result<Self> {
        match ctx.attention {
            SeqAttention::Group(cx) => {
                let sh = cx.layout.shapes(ctx.dims.q_heads, ctx.dims.kv_heads);
                Self::new_cp(exec, &ctx.dims, tokens, &sh)
            }
            SeqAttention::Local { .. } => Self::new(exec, &ctx.dims, tokens),
        }
    }

    /// Tensors for the `tokens` tokens of a CP rank: q, k, v, lse in the head-sharded layout
    /// of `shapes` (see [`crate::parallel::cp::attn`]), plus `att_cp`.
    pub fn new_cp(
        exec: &DeviceCtx,
        dims: &BlockDims,
        tokens: usize,
        shapes: &CpShapes,
    ) -> Result<Self> {
        let hd = dims.head_dim;
        let mut acts = Self::new(exec, dims, tokens)?;
        acts.q = exec.empty(&[shapes.tokens, shapes.q_heads * hd])?;
        acts.k = exec.empty(&[shapes.tokens, shapes.kv_heads * hd])?;
        acts.v = exec.empty(&[shapes.tokens, shapes.kv_heads * hd])?;
        acts.lse = exec.empty(&[
            shapes.tokens,
            shapes.q_heads,
            cannon_kernels::attention::lse_per_head(exec.device()),
        ])?;
        acts.att_cp = Some(exec.empty(&[shapes.tokens, shapes.q_heads * hd])?);
        Ok(acts)
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

impl<A: ActElem> BlockActs<A> {
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
    /// This rank's tokens only, or across its context-parallel group (`crate::parallel::cp`).
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
    pub fn new(exec: &DeviceCtx, dims: &BlockDims, tokens: usize) -> Result<Self> {
        let (d, dq, dkv, i) = (dims.d, dims.dq(), dims.dkv(), dims.inter);
        Ok(FwdScratch {
            n: exec.empty(&[tokens, d])?,
            q: exec.empty(&[tokens, dq])?,
            k: exec.empty(&[tokens, dkv])?,
            v: exec.empty(&[tokens, dkv])?,
            h: exec.empty(&[tokens, i])?,
            tmp: gelu_tmp(exec, dims, tokens)?,
        })
    }
}

pub(super) fn gelu_tmp(
    exec: &DeviceCtx,
    dims: &BlockDims,
    tokens: usize,
) -> Result<Option<Tensor<f32>>> {
    match dims.act {
        HiddenAct::Gelu => Ok(Some(exec.empty(&[tokens, dims.inter])?)),
        HiddenAct::Silu => Ok(None),
    }
}

/// `out[T,D] = block(input[T,D])`, saving activations in `acts`.
pub fn block_forward<A: ActElem>(
    stream: &Stream,
    ctx: &BlockCtx,
    weights: &BlockWeights,
    acts: &mut BlockActs<A>,
    scratch: &mut FwdScratch,
    input: &BufferView<'_, f32>,
    out: &mut BufferViewMut<'_, f32>,
) -> ModelResult<()> {
    let dims = ctx.dims;
    let (dm, dq, dkv) = (dims.d, dims.dq(), dims.dkv());
    norm_store(
        stream,
        &dims,
        scratch,
        input,
        &weights.attn_norm,
        &mut acts.rstd1,
        &mut acts.ln1,
    )?;
    let ln1 = acts.ln1.view();
    linear(stream, &mut scratch.q.view_mut(), &ln1, &weights.q, dm, dq)?;
    linear(stream, &mut scratch.k.view_mut(), &ln1, &weights.k, dm, dkv)?;
    linear(stream, &mut scratch.v.view_mut(), &ln1, &weights.v, dm, dkv)?;
    ops::rope_forward(
        stream,
        &mut scratch.q.view_mut(),
        dims.q_heads,
        ctx.rope,
        ctx.pos,
    )?;
    ops::rope_forward(
        stream,
        &mut scratch.k.view_mut(),
        dims.kv_heads,
        ctx.rope,
        ctx.pos,
    )?;
    let saved = AttnSaved {
        q: &mut acts.q,
        k: &mut acts.k,
        v: &mut acts.v,
        att: &mut acts.att,
        lse: &mut acts.lse,
        att_cp: acts.att_cp.as_mut(),
    };
    ctx.attention.forward(
        stream,
        &dims.attn(),
        (&scratch.q, &scratch.k, &scratch.v),
        saved,
    )?;
    linear(
        stream,
        &mut acts.mid.view_mut(),
        &acts.att.view(),
        &weights.o,
        dq,
        dm,
    )?;
    add_into(stream, &mut acts.mid.view_mut(), input)?;

    norm_store(
        stream,
        &dims,
        scratch,
        &acts.mid.view(),
        &weights.mlp_norm,
        &mut acts.rstd2,
        &mut acts.ln2,
    )?;
    let ln2 = acts.ln2.view();
    linear(
        stream,
        &mut acts.gate.view_mut(),
        &ln2,
        &weights.gate,
        dm,
        dims.inter,
    )?;
    linear(
        stream,
        &mut acts.up.view_mut(),
        &ln2,
        &weights.up,
        dm,
        dims.inter,
    )?;
    gated_store(stream, &dims, scratch, &acts.gate, &acts.up, &mut acts.h)?;
    linear(stream, out, &acts.h.view(), &weights.down, dims.inter, dm)?;
    Ok(add_into(stream, out, &acts.mid.view())?)
}

/// `ln = rmsnorm(input) weight` in f32, stored as `A` (`rstd [T]`, `ln [T,D]`): the forward's
/// two norms, and what selective recompute makes again bit for bit (same kernel, same input).
pub fn norm_store<A: ActElem>(
    stream: &Stream,
    dims: &BlockDims,
    scratch: &mut FwdScratch,
    input: &BufferView<'_, f32>,
    weight: &BufferView<'_, f32>,
    rstd: &mut Tensor<f32>,
    ln: &mut Tensor<A>,
) -> Result<()> {
    let mut r = rstd.view_mut();
    ops::rmsnorm_forward(
        stream,
        &mut scratch.n.view_mut(),
        &mut r,
        input,
        weight,
        dims.d,
        dims.eps,
    )?;
    store(stream, &scratch.n.view(), &mut ln.view_mut())
}

/// `hidden [T,I] = act(gate) * up` in f32, stored as `A` (the forward's, and selective
/// recompute's).
pub fn gated_store<A: ActElem>(
    stream: &Stream,
    dims: &BlockDims,
    scratch: &mut FwdScratch,
    gate: &Tensor<f32>,
    up: &Tensor<f32>,
    hidden: &mut Tensor<A>,
) -> Result<()> {
    gated_forward(
        stream,
        dims.act,
        gate,
        up,
        &mut scratch.h,
        scratch.tmp.as_mut(),
    )?;
    store(stream, &scratch.h.view(), &mut hidden.view_mut())
}
