//! Every op on runtime buffers: the public entry points of the one dispatch point.
//!
//! Each function checks that its operands live on `stream`'s device and runs the op on the
//! backend of that device ([`crate::backend`]): on the CPU the slice-level kernel on the
//! buffers' host slices (bit-identical to calling it directly), on an NPU the op's aclnn
//! body. Shapes, conventions and errors are the slice-level op's; the slice-level function
//! each entry point names documents them.

use crate::adamw::AdamW;
use crate::attention::{BlockAttention, QkvBuf, QkvGradBuf, VarlenAttention};
use crate::backend::{dispatch, Backend};
use crate::cross_entropy::{CeStats, LmHeadGrads, LossNorm};
use crate::error::Result;
use crate::gemm::{Dims, Precision, Trans};
use crate::grad_clip::clip_coefficient;
use crate::index::TransposeDims;
use crate::linear::{LinearDims, LinearGradBufs};
use crate::patch_embed::{PatchEmbedGradBufs, PatchGeom};
use crate::rope::RopeTable;
use cannon_runtime::{BufferView, BufferViewMut, Stream};
use cannon_runtime::{Element, Float};

/// [`crate::adamw::adamw_step`] on `stream`'s device: One AdamW step of `params`, `m`, `v` in place ([`crate::adamw`]).
pub fn adamw_step(
    stream: &Stream,
    params: &mut BufferViewMut<'_, f32>,
    grads: &BufferView<'_, f32>,
    m: &mut BufferViewMut<'_, f32>,
    v: &mut BufferViewMut<'_, f32>,
    step: u64,
    hp: &AdamW,
) -> Result<()> {
    dispatch!("adamw_step", stream, [params, grads, m, v], |be| {
        be.adamw_step(stream, params, grads, m, v, step, hp)
    })
}

/// [`crate::attention::forward`] on `stream`'s device: Varlen attention forward: writes `out` and `lse` ([`crate::attention`]).
pub fn attention_forward<E: Float>(
    stream: &Stream,
    a: &VarlenAttention,
    x: QkvBuf<'_, E>,
    out: &mut BufferViewMut<'_, E>,
    lse: &mut BufferViewMut<'_, f32>,
) -> Result<()> {
    dispatch!("attention_forward", stream, [x, out, lse], |be| {
        be.attention_forward(stream, a, x, out, lse)
    })
}

/// [`crate::attention::backward`] on `stream`'s device: Varlen attention backward: overwrites dq, dk, dv.
pub fn attention_backward<E: Float>(
    stream: &Stream,
    a: &VarlenAttention,
    x: QkvBuf<'_, E>,
    out: &BufferView<'_, E>,
    lse: &BufferView<'_, f32>,
    dout: &BufferView<'_, E>,
    g: QkvGradBuf<'_, '_, E>,
) -> Result<()> {
    dispatch!("attention_backward", stream, [x, out, lse, dout, g], |be| {
        be.attention_backward(stream, a, x, out, lse, dout, g)
    })
}

/// [`crate::attention::block_forward_merge`] on `stream`'s device: a ring attention block
/// merged into the f32 `out` and `lse` accumulators (NPU: an error, no body yet).
pub fn attention_block_forward<E: Float>(
    stream: &Stream,
    a: &BlockAttention,
    x: QkvBuf<'_, E>,
    out: &mut BufferViewMut<'_, f32>,
    lse: &mut BufferViewMut<'_, f32>,
) -> Result<()> {
    dispatch!("attention_block_forward", stream, [x, out, lse], |be| {
        be.attention_block_forward(stream, a, x, out, lse)
    })
}

/// [`crate::attention::block_backward_accumulate`] on `stream`'s device: a ring attention
/// block's gradients added into the f32 dq, dk, dv (NPU: an error, no body yet).
pub fn attention_block_backward<E: Float>(
    stream: &Stream,
    a: &BlockAttention,
    x: QkvBuf<'_, E>,
    out: &BufferView<'_, E>,
    lse: &BufferView<'_, f32>,
    dout: &BufferView<'_, E>,
    g: QkvGradBuf<'_, '_, f32>,
) -> Result<()> {
    dispatch!(
        "attention_block_backward",
        stream,
        [x, out, lse, dout, g],
        |be| { be.attention_block_backward(stream, a, x, out, lse, dout, g) }
    )
}

/// [`crate::cast::cast`] on `stream`'s device: `dst = src` converted between storage types ([`crate::cast`]).
pub fn cast<A: Float, B: Float>(
    stream: &Stream,
    src: &BufferView<'_, A>,
    dst: &mut BufferViewMut<'_, B>,
) -> Result<()> {
    dispatch!("cast", stream, [src, dst], |be| {
        be.cast(stream, src, dst)
    })
}

/// [`crate::cross_entropy::cross_entropy`] on `stream`'s device: Cross-entropy of `[N, V]` logits; writes `d_logits` when given.
pub fn cross_entropy(
    stream: &Stream,
    logits: &BufferView<'_, f32>,
    labels: &[i32],
    vocab: usize,
    d_logits: Option<&mut BufferViewMut<'_, f32>>,
    norm: LossNorm,
) -> Result<CeStats> {
    dispatch!("cross_entropy", stream, [logits, d_logits], |be| {
        be.cross_entropy(stream, logits, labels, vocab, d_logits, norm)
    })
}

/// [`crate::cross_entropy::cross_entropy_in_place`] on `stream`'s device: Cross-entropy whose gradient overwrites the logits.
pub fn cross_entropy_in_place(
    stream: &Stream,
    logits: &mut BufferViewMut<'_, f32>,
    labels: &[i32],
    vocab: usize,
    norm: LossNorm,
) -> Result<CeStats> {
    dispatch!("cross_entropy_in_place", stream, [logits], |be| {
        be.cross_entropy_in_place(stream, logits, labels, vocab, norm)
    })
}

/// [`crate::cross_entropy::cross_entropy_chunked`] on `stream`'s device: Cross-entropy of the lm_head logits `h w^T`, `chunk_rows` rows at a time.
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_lm_head(
    stream: &Stream,
    h: &BufferView<'_, f32>,
    w: &BufferView<'_, f32>,
    labels: &[i32],
    d_model: usize,
    vocab: usize,
    chunk_rows: usize,
    norm: LossNorm,
    grads: LmHeadGrads<'_>,
) -> Result<CeStats> {
    grads.check(h.len(), w.len(), labels.len(), d_model, vocab)?;
    dispatch!("cross_entropy_lm_head", stream, [h, w, grads], |be| {
        be.cross_entropy_lm_head(
            stream, h, w, labels, d_model, vocab, chunk_rows, norm, grads,
        )
    })
}

/// [`crate::embedding::embedding_forward`] on `stream`'s device: Gathers rows `ids` of `weight` ([`crate::embedding`]).
pub fn embedding_forward<E: Float>(
    stream: &Stream,
    out: &mut BufferViewMut<'_, E>,
    ids: &[u32],
    weight: &BufferView<'_, E>,
    dim: usize,
) -> Result<()> {
    dispatch!("embedding_forward", stream, [out, weight], |be| {
        be.embedding_forward(stream, out, ids, weight, dim)
    })
}

/// [`crate::embedding::embedding_backward`] on `stream`'s device: `dweight[ids[t]] += dout[t]`.
pub fn embedding_backward<E: Float>(
    stream: &Stream,
    dweight: &mut BufferViewMut<'_, f32>,
    dout: &BufferView<'_, E>,
    ids: &[u32],
    dim: usize,
) -> Result<()> {
    dispatch!("embedding_backward", stream, [dweight, dout], |be| {
        be.embedding_backward(stream, dweight, dout, ids, dim)
    })
}

/// [`crate::gelu::gelu_forward`] on `stream`'s device: `y = gelu(x)` ([`crate::gelu`]).
pub fn gelu_forward<E: Float>(
    stream: &Stream,
    y: &mut BufferViewMut<'_, E>,
    x: &BufferView<'_, E>,
) -> Result<()> {
    dispatch!("gelu_forward", stream, [y, x], |be| {
        be.gelu_forward(stream, y, x)
    })
}

/// [`crate::gelu::gelu_backward`] on `stream`'s device: `dx += dy * gelu'(x)`.
pub fn gelu_backward<E: Float>(
    stream: &Stream,
    dx: &mut BufferViewMut<'_, E>,
    dy: &BufferView<'_, E>,
    x: &BufferView<'_, E>,
) -> Result<()> {
    dispatch!("gelu_backward", stream, [dx, dy, x], |be| {
        be.gelu_backward(stream, dx, dy, x)
    })
}

/// [`crate::gemm::gemm_f32`] on `stream`'s device: `C = alpha op(A) op(B) + beta C` in precision `p` ([`crate::gemm`]).
#[allow(clippy::too_many_arguments)]
pub fn gemm<A: Float, B: Float>(
    stream: &Stream,
    p: Precision,
    ta: Trans,
    tb: Trans,
    d: Dims,
    alpha: f32,
    a: &BufferView<'_, A>,
    lda: usize,
    b: &BufferView<'_, B>,
    ldb: usize,
    beta: f32,
    c: &mut BufferViewMut<'_, f32>,
    ldc: usize,
) -> Result<()> {
    dispatch!("gemm", stream, [a, b, c], |be| {
        be.gemm(stream, p, ta, tb, d, alpha, a, lda, b, ldb, beta, c, ldc)
    })
}

/// [`crate::grad_clip::grad_sum_squares`] on `stream`'s device: Sum of squares of every element of every view, in f64 ([`crate::grad_clip`]).
pub fn grad_sum_squares(stream: &Stream, grads: &[BufferView<'_, f32>]) -> Result<f64> {
    dispatch!("grad_sum_squares", stream, [grads], |be| {
        be.grad_sum_squares(stream, grads)
    })
}

/// [`crate::grad_clip::scale_grads`] on `stream`'s device: Every element of every view times `coef`.
pub fn scale_grads(stream: &Stream, grads: &mut [BufferViewMut<'_, f32>], coef: f32) -> Result<()> {
    dispatch!("scale_grads", stream, [grads], |be| {
        be.scale_grads(stream, grads, coef)
    })
}

/// [`crate::linear::linear_forward`] on `stream`'s device: `y = x w^T (+ b)` in precision `p` ([`crate::linear`]).
pub fn linear_forward<Y: Float, X: Float, W: Float>(
    stream: &Stream,
    p: Precision,
    y: &mut BufferViewMut<'_, Y>,
    x: &BufferView<'_, X>,
    w: &BufferView<'_, W>,
    b: Option<&BufferView<'_, W>>,
    d: LinearDims,
) -> Result<()> {
    dispatch!("linear_forward", stream, [y, x, w, b], |be| {
        be.linear_forward(stream, p, y, x, w, b, d)
    })
}

/// [`crate::linear::linear_backward`] on `stream`'s device: Accumulates the gradients present in `g`, in precision `p`.
pub fn linear_backward<G: Float, X: Float, W: Float>(
    stream: &Stream,
    p: Precision,
    g: LinearGradBufs<'_>,
    dy: &BufferView<'_, G>,
    x: &BufferView<'_, X>,
    w: &BufferView<'_, W>,
    d: LinearDims,
) -> Result<()> {
    dispatch!("linear_backward", stream, [g, dy, x, w], |be| {
        be.linear_backward(stream, p, g, dy, x, w, d)
    })
}

/// [`crate::patch_embed::patch_embed_forward`] on `stream`'s device: `out = im2col(pixels) weight^T` in precision `p` ([`crate::patch_embed`]).
pub fn patch_embed_forward<P: Float, W: Float>(
    stream: &Stream,
    p: Precision,
    out: &mut BufferViewMut<'_, f32>,
    pixels: &BufferView<'_, P>,
    weight: &BufferView<'_, W>,
    g: PatchGeom,
    d_model: usize,
) -> Result<()> {
    dispatch!("patch_embed_forward", stream, [out, pixels, weight], |be| {
        be.patch_embed_forward(stream, p, out, pixels, weight, g, d_model)
    })
}

/// [`crate::patch_embed::patch_embed_backward`] on `stream`'s device: Accumulates the gradients present in `grads`, in precision `p`.
#[allow(clippy::too_many_arguments)]
pub fn patch_embed_backward<G: Float, P: Float, W: Float>(
    stream: &Stream,
    p: Precision,
    grads: PatchEmbedGradBufs<'_>,
    dout: &BufferView<'_, G>,
    pixels: &BufferView<'_, P>,
    weight: &BufferView<'_, W>,
    g: PatchGeom,
    d_model: usize,
) -> Result<()> {
    dispatch!(
        "patch_embed_backward",
        stream,
        [grads, dout, pixels, weight],
        |be| { be.patch_embed_backward(stream, p, grads, dout, pixels, weight, g, d_model) }
    )
}

/// [`crate::rmsnorm::rmsnorm_forward`] on `stream`'s device: `out = rmsnorm(x) * weight`, saving `rstd` ([`crate::rmsnorm`]).
pub fn rmsnorm_forward<E: Float>(
    stream: &Stream,
    out: &mut BufferViewMut<'_, E>,
    rstd: &mut BufferViewMut<'_, f32>,
    x: &BufferView<'_, E>,
    weight: &BufferView<'_, E>,
    dim: usize,
    eps: f32,
) -> Result<()> {
    dispatch!("rmsnorm_forward", stream, [out, rstd, x, weight], |be| {
        be.rmsnorm_forward(stream, out, rstd, x, weight, dim, eps)
    })
}

/// [`crate::rmsnorm::rmsnorm_backward`] on `stream`'s device: Accumulates `dx` and `dweight`.
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_backward<E: Float>(
    stream: &Stream,
    dx: &mut BufferViewMut<'_, E>,
    dweight: &mut BufferViewMut<'_, f32>,
    dout: &BufferView<'_, E>,
    x: &BufferView<'_, E>,
    weight: &BufferView<'_, E>,
    rstd: &BufferView<'_, f32>,
    dim: usize,
) -> Result<()> {
    dispatch!(
        "rmsnorm_backward",
        stream,
        [dx, dweight, dout, x, weight, rstd],
        |be| { be.rmsnorm_backward(stream, dx, dweight, dout, x, weight, rstd, dim) }
    )
}

/// [`crate::rope::rope_forward`] on `stream`'s device: Rotates `x` in place by the angles of `pos` ([`crate::rope`]).
pub fn rope_forward<E: Float>(
    stream: &Stream,
    x: &mut BufferViewMut<'_, E>,
    n_heads: usize,
    table: &RopeTable,
    pos: &[u32],
) -> Result<()> {
    dispatch!("rope_forward", stream, [x], |be| {
        be.rope_forward(stream, x, n_heads, table, pos)
    })
}

/// [`crate::rope::rope_backward`] on `stream`'s device: The inverse rotation of `dx`, in place.
pub fn rope_backward<E: Float>(
    stream: &Stream,
    dx: &mut BufferViewMut<'_, E>,
    n_heads: usize,
    table: &RopeTable,
    pos: &[u32],
) -> Result<()> {
    dispatch!("rope_backward", stream, [dx], |be| {
        be.rope_backward(stream, dx, n_heads, table, pos)
    })
}

/// [`crate::swiglu::swiglu_forward`] on `stream`'s device: `h = silu(gate) * up` ([`crate::swiglu`]).
pub fn swiglu_forward<E: Float>(
    stream: &Stream,
    h: &mut BufferViewMut<'_, E>,
    gate: &BufferView<'_, E>,
    up: &BufferView<'_, E>,
) -> Result<()> {
    dispatch!("swiglu_forward", stream, [h, gate, up], |be| {
        be.swiglu_forward(stream, h, gate, up)
    })
}

/// [`crate::swiglu::swiglu_backward`] on `stream`'s device: Accumulates `d_gate` and `d_up`.
pub fn swiglu_backward<E: Float>(
    stream: &Stream,
    d_gate: &mut BufferViewMut<'_, E>,
    d_up: &mut BufferViewMut<'_, E>,
    dh: &BufferView<'_, E>,
    gate: &BufferView<'_, E>,
    up: &BufferView<'_, E>,
) -> Result<()> {
    dispatch!(
        "swiglu_backward",
        stream,
        [d_gate, d_up, dh, gate, up],
        |be| { be.swiglu_backward(stream, d_gate, d_up, dh, gate, up) }
    )
}

/// [`crate::grad_clip::clip_with_sum_squares`] on `stream`'s device: given the sum of squares
/// of every gradient (summed across ranks by the caller), scales `grads` by
/// `max_norm / (norm + 1e-6)` when that is below 1; returns the pre-clip norm.
pub fn clip_with_sum_squares(
    stream: &Stream,
    grads: &mut [BufferViewMut<'_, f32>],
    total_sum_squares: f64,
    max_norm: f64,
) -> Result<f64> {
    // The slice-level call on no slices validates max_norm and forms the norm with the same
    // code on every backend; the scaling is the backend's.
    let norm = crate::grad_clip::clip_with_sum_squares::<&mut [f32]>(
        &mut [],
        total_sum_squares,
        max_norm,
    )?;
    if let Some(coef) = clip_coefficient(norm, max_norm) {
        // torch multiplies by the coefficient in the gradients' dtype (f32).
        scale_grads(stream, grads, coef as f32)?;
    }
    Ok(norm)
}

/// [`crate::grad_clip::clip_grad_norm`] on `stream`'s device (one process): the global L2
/// norm of `grads`, which are scaled in place when it exceeds `max_norm`.
pub fn clip_grad_norm(
    stream: &Stream,
    grads: &mut [BufferViewMut<'_, f32>],
    max_norm: f64,
) -> Result<f64> {
    let views: Vec<BufferView<'_, f32>> = grads.iter().map(|g| g.as_view()).collect();
    let ss = grad_sum_squares(stream, &views)?;
    drop(views);
    clip_with_sum_squares(stream, grads, ss, max_norm)
}

/// [`crate::elementwise::add_into`] on `stream`'s device: `y += x` ([`crate::elementwise`]).
pub fn add_into<E: Float>(
    stream: &Stream,
    y: &mut BufferViewMut<'_, E>,
    x: &BufferView<'_, E>,
) -> Result<()> {
    dispatch!("add_into", stream, [y, x], |be| be.add_into(stream, y, x))
}

/// [`crate::elementwise::mul`] on `stream`'s device: `out = a * b`.
pub fn mul<E: Float>(
    stream: &Stream,
    out: &mut BufferViewMut<'_, E>,
    a: &BufferView<'_, E>,
    b: &BufferView<'_, E>,
) -> Result<()> {
    dispatch!("mul", stream, [out, a, b], |be| be.mul(stream, out, a, b))
}

/// [`crate::elementwise::mul_into`] on `stream`'s device: `y *= x`.
pub fn mul_into<E: Float>(
    stream: &Stream,
    y: &mut BufferViewMut<'_, E>,
    x: &BufferView<'_, E>,
) -> Result<()> {
    dispatch!("mul_into", stream, [y, x], |be| be.mul_into(stream, y, x))
}

/// [`crate::index::gather_rows`] on `stream`'s device: `out[i] = src[idx[i]]` ([`crate::index`]).
pub fn gather_rows<T: Element>(
    stream: &Stream,
    out: &mut BufferViewMut<'_, T>,
    src: &BufferView<'_, T>,
    idx: &[usize],
    dim: usize,
) -> Result<()> {
    dispatch!("gather_rows", stream, [out, src], |be| {
        be.gather_rows(stream, out, src, idx, dim)
    })
}

/// [`crate::index::scatter_rows`] on `stream`'s device: `dst[idx[i]] = src[i]`.
pub fn scatter_rows<T: Element>(
    stream: &Stream,
    dst: &mut BufferViewMut<'_, T>,
    src: &BufferView<'_, T>,
    idx: &[usize],
    dim: usize,
) -> Result<()> {
    dispatch!("scatter_rows", stream, [dst, src], |be| {
        be.scatter_rows(stream, dst, src, idx, dim)
    })
}

/// [`crate::index::scatter_add_rows`] on `stream`'s device: `dst[idx[i]] += src[i]`.
pub fn scatter_add_rows<E: Float>(
    stream: &Stream,
    dst: &mut BufferViewMut<'_, E>,
    src: &BufferView<'_, E>,
    idx: &[usize],
    dim: usize,
) -> Result<()> {
    dispatch!("scatter_add_rows", stream, [dst, src], |be| {
        be.scatter_add_rows(stream, dst, src, idx, dim)
    })
}

/// [`crate::index::zero_rows`] on `stream`'s device: `dst[idx[i]] = 0`.
pub fn zero_rows<T: Element>(
    stream: &Stream,
    dst: &mut BufferViewMut<'_, T>,
    idx: &[usize],
    dim: usize,
) -> Result<()> {
    dispatch!("zero_rows", stream, [dst], |be| {
        be.zero_rows(stream, dst, idx, dim)
    })
}

/// [`crate::index::transpose`] on `stream`'s device: `out[b, c, r] = x[b, r, c]`.
pub fn transpose<T: Element>(
    stream: &Stream,
    out: &mut BufferViewMut<'_, T>,
    x: &BufferView<'_, T>,
    d: TransposeDims,
) -> Result<()> {
    dispatch!("transpose", stream, [out, x], |be| be
        .transpose(stream, out, x, d))
}
