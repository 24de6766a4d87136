//! One pre-norm transformer block, shared by Pixtral and Mistral (they differ only in sizes,
//! the attention mask, the RoPE table and the MLP gate activation):
//!
//! ```text
//! ln1 = rmsnorm(x)                                   [T,D]
//! q,k,v = ln1 Wq^T, ln1 Wk^T, ln1 Wv^T; rope(q,k)    [T,Hq*Hd], [T,Hkv*Hd]
//! att = attention(q,k,v)   (varlen, GQA)             [T,Hq*Hd]
//! mid = x + att Wo^T                                 [T,D]
//! ln2 = rmsnorm(mid)
//! h = act(ln2 Wgate^T) * (ln2 Wup^T)                 [T,I]
//! out = mid + h Wdown^T                              [T,D]
//! ```
//!
//! Forward saves what backward needs in [`BlockActs`]; [`block_backward`] is the same list
//! read bottom-up.

use super::ops::{self, Attn, GateAct, Precision, RopeTable};
use cannon_kernels::KernelError;

/// The sizes and flavour of a block.
#[derive(Clone, Copy, Debug)]
pub struct BlockDims {
    pub d: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub inter: usize,
    pub causal: bool,
    pub act: GateAct,
    pub eps: f64,
}

impl BlockDims {
    fn dq(&self) -> usize {
        self.q_heads * self.head_dim
    }

    fn dkv(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// A block's weights (views into its layer's flat group); shapes `[out, in]`.
#[derive(Clone, Copy, Debug)]
pub struct BlockWeights<'a> {
    pub attn_norm: &'a [f32],
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub o: &'a [f32],
    pub mlp_norm: &'a [f32],
    pub gate: &'a [f32],
    pub up: &'a [f32],
    pub down: &'a [f32],
}

/// Gradient buffers of a block, laid out like [`BlockWeights`] (accumulated into).
#[derive(Debug)]
pub struct BlockGrads<'a> {
    pub attn_norm: &'a mut [f32],
    pub q: &'a mut [f32],
    pub k: &'a mut [f32],
    pub v: &'a mut [f32],
    pub o: &'a mut [f32],
    pub mlp_norm: &'a mut [f32],
    pub gate: &'a mut [f32],
    pub up: &'a mut [f32],
    pub down: &'a mut [f32],
}

/// What the forward of one block saves for T tokens.
#[derive(Clone, Debug, Default)]
pub struct BlockActs {
    pub rstd1: Vec<f32>, // [T]
    pub ln1: Vec<f32>,   // [T,D]
    pub q: Vec<f32>,     // [T,Hq*Hd] after RoPE
    pub k: Vec<f32>,     // [T,Hkv*Hd] after RoPE
    pub v: Vec<f32>,     // [T,Hkv*Hd]
    pub att: Vec<f32>,   // [T,Hq*Hd]
    pub lse: Vec<f32>,   // [T,Hq]
    pub mid: Vec<f32>,   // [T,D]
    pub rstd2: Vec<f32>, // [T]
    pub ln2: Vec<f32>,   // [T,D]
    pub gate: Vec<f32>,  // [T,I]
    pub up: Vec<f32>,    // [T,I]
    pub h: Vec<f32>,     // [T,I]
}

impl BlockActs {
    /// Buffers for `t` tokens, planned from the sizes.
    pub fn new(dims: &BlockDims, t: usize) -> Self {
        let z = |n: usize| vec![0.0; n];
        BlockActs {
            rstd1: z(t),
            ln1: z(t * dims.d),
            q: z(t * dims.dq()),
            k: z(t * dims.dkv()),
            v: z(t * dims.dkv()),
            att: z(t * dims.dq()),
            lse: z(t * dims.q_heads),
            mid: z(t * dims.d),
            rstd2: z(t),
            ln2: z(t * dims.d),
            gate: z(t * dims.inter),
            up: z(t * dims.inter),
            h: z(t * dims.inter),
        }
    }
}

/// What a block's position-dependent parts need: the RoPE table and the sequence boundaries.
#[derive(Clone, Copy, Debug)]
pub struct BlockCtx<'a> {
    pub dims: BlockDims,
    pub rope: &'a RopeTable,
    /// Cumulative sequence ends, no leading 0 (images for Pixtral, batch rows for Mistral).
    pub cu_seqlens: &'a [usize],
    pub prec: Precision,
}

impl BlockCtx<'_> {
    fn attn(&self) -> Attn<'_> {
        Attn {
            cu_seqlens: self.cu_seqlens,
            q_heads: self.dims.q_heads,
            kv_heads: self.dims.kv_heads,
            head_dim: self.dims.head_dim,
            causal: self.dims.causal,
        }
    }
}

/// `out[T,D] = block(x[T,D])`, saving activations in `a`.
pub fn block_forward(
    c: &BlockCtx,
    w: &BlockWeights,
    a: &mut BlockActs,
    x: &[f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let d = c.dims;
    let p = c.prec;
    ops::rmsnorm_forward(&mut a.ln1, &mut a.rstd1, x, w.attn_norm, d.eps);
    p.round(&mut a.ln1);
    ops::linear_forward(&mut a.q, &a.ln1, w.q, d.d, d.dq())?;
    ops::linear_forward(&mut a.k, &a.ln1, w.k, d.d, d.dkv())?;
    ops::linear_forward(&mut a.v, &a.ln1, w.v, d.d, d.dkv())?;
    ops::rope_forward(&mut a.q, c.rope);
    ops::rope_forward(&mut a.k, c.rope);
    p.round(&mut a.q);
    p.round(&mut a.k);
    p.round(&mut a.v);
    ops::attention_forward(&c.attn(), &mut a.att, &mut a.lse, &a.q, &a.k, &a.v);
    p.round(&mut a.att);
    ops::linear_forward(&mut a.mid, &a.att, w.o, d.dq(), d.d)?;
    for (m, &xv) in a.mid.iter_mut().zip(x) {
        *m += xv;
    }

    ops::rmsnorm_forward(&mut a.ln2, &mut a.rstd2, &a.mid, w.mlp_norm, d.eps);
    p.round(&mut a.ln2);
    ops::linear_forward(&mut a.gate, &a.ln2, w.gate, d.d, d.inter)?;
    ops::linear_forward(&mut a.up, &a.ln2, w.up, d.d, d.inter)?;
    ops::gated_forward(&mut a.h, &a.gate, &a.up, d.act);
    p.round(&mut a.h);
    ops::linear_forward(out, &a.h, w.down, d.inter, d.d)?;
    for (o, &m) in out.iter_mut().zip(&a.mid) {
        *o += m;
    }
    Ok(())
}

/// Scratch for one block's backward, sized for T tokens and reused layer after layer.
#[derive(Debug, Default)]
pub struct BlockScratch {
    dmid: Vec<f32>,  // [T,D]
    dln: Vec<f32>,   // [T,D]
    dh: Vec<f32>,    // [T,I]
    dgate: Vec<f32>, // [T,I]
    dup: Vec<f32>,   // [T,I]
    datt: Vec<f32>,  // [T,Hq*Hd]
    dq: Vec<f32>,    // [T,Hq*Hd]
    dk: Vec<f32>,    // [T,Hkv*Hd]
    dv: Vec<f32>,    // [T,Hkv*Hd]
}

impl BlockScratch {
    pub fn new(dims: &BlockDims, t: usize) -> Self {
        let z = |n: usize| vec![0.0; n];
        BlockScratch {
            dmid: z(t * dims.d),
            dln: z(t * dims.d),
            dh: z(t * dims.inter),
            dgate: z(t * dims.inter),
            dup: z(t * dims.inter),
            datt: z(t * dims.dq()),
            dq: z(t * dims.dq()),
            dk: z(t * dims.dkv()),
            dv: z(t * dims.dkv()),
        }
    }
}

/// Backward of [`block_forward`]: from `dout[T,D]` OVERWRITES `dx[T,D]` and accumulates the
/// weight gradients into `g` (None: a frozen block, only `dx` is computed).
#[allow(clippy::too_many_arguments)]
pub fn block_backward(
    c: &BlockCtx,
    w: &BlockWeights,
    mut g: Option<BlockGrads>,
    a: &BlockActs,
    x: &[f32],
    dout: &[f32],
    dx: &mut [f32],
    s: &mut BlockScratch,
) -> Result<(), KernelError> {
    let d = c.dims;
    // out = mid + h Wdown^T
    s.dh.fill(0.0);
    let gd = g.as_mut().map(|g| &mut *g.down);
    ops::linear_backward(Some(&mut s.dh), gd, dout, &a.h, w.down, d.inter, d.d)?;
    ops::gated_backward(&mut s.dgate, &mut s.dup, &s.dh, &a.gate, &a.up, d.act);
    s.dln.fill(0.0);
    let gg = g.as_mut().map(|g| &mut *g.gate);
    ops::linear_backward(Some(&mut s.dln), gg, &s.dgate, &a.ln2, w.gate, d.d, d.inter)?;
    let gu = g.as_mut().map(|g| &mut *g.up);
    ops::linear_backward(Some(&mut s.dln), gu, &s.dup, &a.ln2, w.up, d.d, d.inter)?;
    s.dmid.copy_from_slice(dout);
    let gn = g.as_mut().map(|g| &mut *g.mlp_norm);
    ops::rmsnorm_backward(&mut s.dmid, gn, &s.dln, &a.mid, w.mlp_norm, &a.rstd2);

    // mid = x + att Wo^T
    s.datt.fill(0.0);
    let go = g.as_mut().map(|g| &mut *g.o);
    ops::linear_backward(Some(&mut s.datt), go, &s.dmid, &a.att, w.o, d.dq(), d.d)?;
    ops::attention_backward(
        &c.attn(),
        &mut s.dq,
        &mut s.dk,
        &mut s.dv,
        &s.datt,
        &a.q,
        &a.k,
        &a.v,
        &a.att,
        &a.lse,
    );
    ops::rope_backward(&mut s.dq, c.rope);
    ops::rope_backward(&mut s.dk, c.rope);
    s.dln.fill(0.0);
    let gq = g.as_mut().map(|g| &mut *g.q);
    ops::linear_backward(Some(&mut s.dln), gq, &s.dq, &a.ln1, w.q, d.d, d.dq())?;
    let gk = g.as_mut().map(|g| &mut *g.k);
    ops::linear_backward(Some(&mut s.dln), gk, &s.dk, &a.ln1, w.k, d.d, d.dkv())?;
    let gv = g.as_mut().map(|g| &mut *g.v);
    ops::linear_backward(Some(&mut s.dln), gv, &s.dv, &a.ln1, w.v, d.d, d.dkv())?;
    dx.copy_from_slice(&s.dmid);
    let gn = g.as_mut().map(|g| &mut *g.attn_norm);
    ops::rmsnorm_backward(dx, gn, &s.dln, x, w.attn_norm, &a.rstd1);
    Ok(())
}
