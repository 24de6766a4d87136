//! One pre-norm transformer block, shared by Pixtral and Mistral (they differ only in sizes,
//! the attention mask, the RoPE table and the MLP gate activation), on `cannon_kernels` ops:
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
//! Forward saves what backward needs in [`BlockActs`]: the inputs of GEMMs and of the
//! attention in activation storage `A` (bf16 in a bf16 run), GEMM outputs, residuals and norm
//! statistics in f32. [`block_backward`] is the same list read bottom-up.

use super::config::HiddenAct;
use super::ops::{self, add_into, linear, linear_back, linear_back_act, store, Act};
use cannon_kernels::attention::{self, Qkv, QkvGrad, VarlenAttention};
use cannon_kernels::rope::{self, RopeTable};
use cannon_kernels::{gelu, rmsnorm, swiglu, KernelError};

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

/// What the forward of one block saves for T tokens (the block input `x` is the caller's).
#[derive(Clone, Debug, Default)]
pub struct BlockActs<A> {
    pub rstd1: Vec<f32>, // [T]
    pub ln1: Vec<A>,     // [T,D]
    pub q: Vec<A>,       // [T,Hq*Hd] after RoPE
    pub k: Vec<A>,       // [T,Hkv*Hd] after RoPE
    pub v: Vec<A>,       // [T,Hkv*Hd]
    pub att: Vec<A>,     // [T,Hq*Hd]
    pub lse: Vec<f32>,   // [T,Hq]
    pub mid: Vec<f32>,   // [T,D]
    pub rstd2: Vec<f32>, // [T]
    pub ln2: Vec<A>,     // [T,D]
    pub gate: Vec<f32>,  // [T,I]
    pub up: Vec<f32>,    // [T,I]
    pub h: Vec<A>,       // [T,I]
}

impl<A: Act> BlockActs<A> {
    /// Buffers for `t` tokens, planned from the sizes.
    pub fn new(dims: &BlockDims, t: usize) -> Self {
        let z = ops::zeros::<A>;
        BlockActs {
            rstd1: vec![0.0; t],
            ln1: z(t * dims.d),
            q: z(t * dims.dq()),
            k: z(t * dims.dkv()),
            v: z(t * dims.dkv()),
            att: z(t * dims.dq()),
            lse: vec![0.0; t * dims.q_heads],
            mid: vec![0.0; t * dims.d],
            rstd2: vec![0.0; t],
            ln2: z(t * dims.d),
            gate: vec![0.0; t * dims.inter],
            up: vec![0.0; t * dims.inter],
            h: z(t * dims.inter),
        }
    }
}

/// What a block's position-dependent parts need: the RoPE table with each token's slot, and
/// the sequence boundaries.
#[derive(Clone, Copy, Debug)]
pub struct BlockCtx<'a> {
    pub dims: BlockDims,
    pub rope: &'a RopeTable,
    /// `[T]` RoPE table slot of every token.
    pub pos: &'a [u32],
    /// Cumulative sequence ends, no leading 0 (images for Pixtral, packed sequences for
    /// Mistral).
    pub cu_seqlens: &'a [usize],
}

impl BlockCtx<'_> {
    fn attn(&self) -> VarlenAttention<'_> {
        let d = &self.dims;
        VarlenAttention::new(
            self.cu_seqlens,
            self.pos.len(),
            d.q_heads,
            d.kv_heads,
            d.head_dim,
            d.causal,
        )
    }
}

/// f32 working buffers of a block, sized for T tokens and reused layer after layer by the
/// forward and the backward; the `A` ones hold the attention's gradients.
#[derive(Debug, Default)]
pub struct BlockScratch<A> {
    dn: Vec<f32>,      // [T,D]     norm output, then its gradient
    dmid: Vec<f32>,    // [T,D]
    q: Vec<f32>,       // [T,Hq*Hd] q before storage, then d att
    k: Vec<f32>,       // [T,Hkv*Hd]
    v: Vec<f32>,       // [T,Hkv*Hd]
    h: Vec<f32>,       // [T,I]     h before storage, then d h
    tmp: Vec<f32>,     // [T,I]     GELU-gate composition
    dgate: Vec<f32>,   // [T,I]
    dup: Vec<f32>,     // [T,I]
    datt: Vec<A>,      // [T,Hq*Hd]
    dq: Vec<A>,        // [T,Hq*Hd]
    dk: Vec<A>,        // [T,Hkv*Hd]
    dv: Vec<A>,        // [T,Hkv*Hd]
    dw_sink: Vec<f32>, // [D]     norm weight gradient of a frozen block
}

impl<A: Act> BlockScratch<A> {
    pub fn new(dims: &BlockDims, t: usize) -> Self {
        let z = |n: usize| vec![0.0f32; n];
        let (nd, nq, nkv, ni) = (t * dims.d, t * dims.dq(), t * dims.dkv(), t * dims.inter);
        BlockScratch {
            dn: z(nd),
            dmid: z(nd),
            q: z(nq),
            k: z(nkv),
            v: z(nkv),
            h: z(ni),
            tmp: z(ni),
            dgate: z(ni),
            dup: z(ni),
            datt: ops::zeros(nq),
            dq: ops::zeros(nq),
            dk: ops::zeros(nkv),
            dv: ops::zeros(nkv),
            dw_sink: z(dims.d),
        }
    }
}

/// `out[T,D] = block(x[T,D])`, saving activations in `a`.
pub fn block_forward<A: Act>(
    c: &BlockCtx,
    w: &BlockWeights,
    a: &mut BlockActs<A>,
    s: &mut BlockScratch<A>,
    x: &[f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let d = c.dims;
    let (dm, dq, dkv) = (d.d, d.dq(), d.dkv());
    rmsnorm::rmsnorm_forward(&mut s.dn, &mut a.rstd1, x, w.attn_norm, dm, d.eps)?;
    store(&s.dn, &mut a.ln1)?;
    linear(&mut s.q, &a.ln1, w.q, dm, dq)?;
    linear(&mut s.k, &a.ln1, w.k, dm, dkv)?;
    linear(&mut s.v, &a.ln1, w.v, dm, dkv)?;
    rope::rope_forward(&mut s.q, d.q_heads, c.rope, c.pos)?;
    rope::rope_forward(&mut s.k, d.kv_heads, c.rope, c.pos)?;
    store(&s.q, &mut a.q)?;
    store(&s.k, &mut a.k)?;
    store(&s.v, &mut a.v)?;
    let qkv = Qkv {
        q: &a.q[..],
        k: &a.k[..],
        v: &a.v[..],
    };
    attention::forward(&c.attn(), qkv, &mut a.att, &mut a.lse)?;
    linear(&mut a.mid, &a.att, w.o, dq, dm)?;
    add_into(&mut a.mid, x);

    rmsnorm::rmsnorm_forward(&mut s.dn, &mut a.rstd2, &a.mid, w.mlp_norm, dm, d.eps)?;
    store(&s.dn, &mut a.ln2)?;
    linear(&mut a.gate, &a.ln2, w.gate, dm, d.inter)?;
    linear(&mut a.up, &a.ln2, w.up, dm, d.inter)?;
    gated_forward(d.act, &a.gate, &a.up, &mut s.h, &mut s.tmp)?;
    store(&s.h, &mut a.h)?;
    linear(out, &a.h, w.down, d.inter, dm)?;
    add_into(out, &a.mid);
    Ok(())
}

/// `h[T,I] = act(gate) * up` in f32 (overwrites h). SiLU is the swiglu kernel; the GELU gate
/// (Pixtral's default `hidden_act`) is composed from the gelu kernel and a product.
fn gated_forward(
    act: HiddenAct,
    gate: &[f32],
    up: &[f32],
    h: &mut [f32],
    tmp: &mut [f32],
) -> Result<(), KernelError> {
    match act {
        HiddenAct::Silu => swiglu::swiglu_forward(h, gate, up),
        HiddenAct::Gelu => {
            gelu::gelu_forward(tmp, gate)?;
            for ((h, &g), &u) in h.iter_mut().zip(tmp.iter()).zip(up) {
                *h = g * u;
            }
            Ok(())
        }
    }
}

/// Backward of [`gated_forward`]: OVERWRITES `dgate`, `dup` from `dh`.
fn gated_backward(
    act: HiddenAct,
    gate: &[f32],
    up: &[f32],
    dh: &[f32],
    s: (&mut [f32], &mut [f32], &mut [f32]),
) -> Result<(), KernelError> {
    let (dgate, dup, tmp) = s;
    dgate.fill(0.0);
    dup.fill(0.0);
    match act {
        HiddenAct::Silu => swiglu::swiglu_backward(dgate, dup, dh, gate, up),
        HiddenAct::Gelu => {
            // d up = dh gelu(gate);  d gate = gelu'(gate) (dh up)
            gelu::gelu_forward(dup, gate)?;
            for (((du, t), &g), &u) in dup.iter_mut().zip(tmp.iter_mut()).zip(dh).zip(up) {
                *du *= g;
                *t = g * u;
            }
            gelu::gelu_backward(dgate, tmp, gate)
        }
    }
}

/// Backward of [`block_forward`]: from `dout[T,D]` OVERWRITES `dx[T,D]` and accumulates the
/// weight gradients into `g` (None: a frozen block, only `dx` is computed).
#[allow(clippy::too_many_arguments)]
pub fn block_backward<A: Act>(
    c: &BlockCtx,
    w: &BlockWeights,
    mut g: Option<BlockGrads>,
    a: &BlockActs<A>,
    s: &mut BlockScratch<A>,
    x: &[f32],
    dout: &[f32],
    dx: &mut [f32],
) -> Result<(), KernelError> {
    let d = c.dims;
    let (dm, dq, dkv, di) = (d.d, d.dq(), d.dkv(), d.inter);
    // out = mid + h Wdown^T
    s.h.fill(0.0);
    let gw = g.as_mut().map(|g| &mut *g.down);
    linear_back(Some(&mut s.h), gw, dout, &a.h, w.down, di, dm)?;
    // h = act(gate) * up;  gate, up = ln2 Wgate^T, ln2 Wup^T
    let tmp = (&mut s.dgate[..], &mut s.dup[..], &mut s.tmp[..]);
    gated_backward(d.act, &a.gate, &a.up, &s.h, tmp)?;
    s.dn.fill(0.0);
    let gw = g.as_mut().map(|g| &mut *g.gate);
    linear_back(Some(&mut s.dn), gw, &s.dgate, &a.ln2, w.gate, dm, di)?;
    let gw = g.as_mut().map(|g| &mut *g.up);
    linear_back(Some(&mut s.dn), gw, &s.dup, &a.ln2, w.up, dm, di)?;
    // ln2 = rmsnorm(mid)
    s.dmid.copy_from_slice(dout);
    let gw = g.as_mut().map_or(&mut s.dw_sink[..], |g| &mut *g.mlp_norm);
    rmsnorm::rmsnorm_backward(&mut s.dmid, gw, &s.dn, &a.mid, w.mlp_norm, &a.rstd2, dm)?;

    // mid = x + att Wo^T
    s.q.fill(0.0);
    let gw = g.as_mut().map(|g| &mut *g.o);
    linear_back(Some(&mut s.q), gw, &s.dmid, &a.att, w.o, dq, dm)?;
    store(&s.q, &mut s.datt)?;
    // att = attention(rope(q), rope(k), v)
    let qkv = Qkv {
        q: &a.q[..],
        k: &a.k[..],
        v: &a.v[..],
    };
    let grads = QkvGrad {
        dq: &mut s.dq[..],
        dk: &mut s.dk[..],
        dv: &mut s.dv[..],
    };
    attention::backward(&c.attn(), qkv, &a.att, &a.lse, &s.datt, grads)?;
    rope::rope_backward(&mut s.dq, d.q_heads, c.rope, c.pos)?;
    rope::rope_backward(&mut s.dk, d.kv_heads, c.rope, c.pos)?;
    // q, k, v = ln1 W^T
    s.dn.fill(0.0);
    let gw = g.as_mut().map(|g| &mut *g.q);
    linear_back_act(Some(&mut s.dn), gw, &s.dq, &a.ln1, w.q, dm, dq)?;
    let gw = g.as_mut().map(|g| &mut *g.k);
    linear_back_act(Some(&mut s.dn), gw, &s.dk, &a.ln1, w.k, dm, dkv)?;
    let gw = g.as_mut().map(|g| &mut *g.v);
    linear_back_act(Some(&mut s.dn), gw, &s.dv, &a.ln1, w.v, dm, dkv)?;
    // ln1 = rmsnorm(x)
    dx.copy_from_slice(&s.dmid);
    let gw = g.as_mut().map_or(&mut s.dw_sink[..], |g| &mut *g.attn_norm);
    rmsnorm::rmsnorm_backward(dx, gw, &s.dn, x, w.attn_norm, &a.rstd1, dm)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gated activations' backward against central differences of their forward, for both
    /// gates (the fixtures only exercise SiLU; Pixtral's class default is GELU). f32 central
    /// differences with step 1e-2 on O(1) inputs are good to ~1e-4 relative; the bar is 1e-3.
    #[test]
    fn gated_backward_matches_finite_differences() {
        let n = 64;
        let val = |i: usize, k: f32| (i as f32 * k).sin() * 2.5;
        let gate: Vec<f32> = (0..n).map(|i| val(i, 0.37)).collect();
        let up: Vec<f32> = (0..n).map(|i| val(i, 0.71)).collect();
        let dh: Vec<f32> = (0..n).map(|i| val(i, 1.13)).collect();
        for act in [HiddenAct::Silu, HiddenAct::Gelu] {
            let (mut dg, mut du, mut tmp) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
            gated_backward(act, &gate, &up, &dh, (&mut dg, &mut du, &mut tmp)).unwrap();
            let h = |g: f32, u: f32| {
                let (mut h, mut t) = ([0.0f32], [0.0f32]);
                gated_forward(act, &[g], &[u], &mut h, &mut t).unwrap();
                h[0]
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
