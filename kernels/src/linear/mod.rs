//! linear: `Y = X W^T (+ b)` and its backward, as three GEMMs with no explicit transposes.
//!
//! ```text
//! T = tokens, I = in features, O = out features (weight layout [O, I], as torch/HF)
//! forward   Y[T,O]   = X[T,I] W[O,I]^T (+ b[O])          gemm(N, T)
//! backward  dX[T,I] += dY[T,O] W[O,I]                    gemm(N, N, beta = 1)   (optional)
//!           dW[O,I] += dY[T,O]^T X[T,I]                  gemm(T, N, beta = 1)   (optional)
//!           db[O]   += sum_t dY[t,O]                                            (optional)
//! ```
//!
//! Backward accumulates (llm.c): callers zero the gradients once per step. `dW` is any
//! `&mut [f32]` window of exactly O*I elements, typically a slice of a layer's flat gradient
//! buffer; `None` skips a gradient (`dX` of the first layer, `dW` of a frozen weight).
//!
//! Two precisions:
//! - f32: everything f32.
//! - bf16: X, W, b and dY are [`Bf16Elem`]s (bf16 storage, or f32 rounded to bf16 as the GEMM
//!   packs them, so f32 activation gradients can feed the bf16 products directly); products
//!   accumulate in f32; Y is written as f32 ([`linear_forward_bf16`]) or bf16
//!   ([`linear_forward_bf16_to_bf16`]); gradients are f32. The bias is added in f32 after the
//!   product, and db sums dY's own values in f32 (no bf16 rounding).

mod cpu;
pub mod device;
pub mod npu;

#[cfg(test)]
mod tests;

use crate::error::{check_len, Result};
use crate::gemm::{Bf16, Bf16Elem, F32};
use half::bf16;

/// The dims of one linear layer applied to `t` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearDims {
    /// Tokens (rows of X and Y).
    pub t: usize,
    /// In features (columns of X and W).
    pub d_in: usize,
    /// Out features (rows of W, columns of Y).
    pub d_out: usize,
}

/// The gradients a backward call accumulates into; `None` skips one.
pub struct LinearGrads<'a> {
    /// `[T, I]`
    pub dx: Option<&'a mut [f32]>,
    /// `[O, I]`
    pub dw: Option<&'a mut [f32]>,
    /// `[O]`
    pub db: Option<&'a mut [f32]>,
}

fn check_forward(op: &'static str, d: LinearDims, y: usize, x: usize, w: usize) -> Result<()> {
    check_len(op, "y", y, d.t * d.d_out)?;
    check_len(op, "x", x, d.t * d.d_in)?;
    check_len(op, "w", w, d.d_out * d.d_in)
}

fn check_backward(op: &'static str, d: LinearDims, g: &LinearGrads, dy: usize) -> Result<()> {
    check_len(op, "dy", dy, d.t * d.d_out)?;
    if let Some(dx) = &g.dx {
        check_len(op, "dx", dx.len(), d.t * d.d_in)?;
    }
    if let Some(dw) = &g.dw {
        check_len(op, "dw", dw.len(), d.d_out * d.d_in)?;
    }
    if let Some(db) = &g.db {
        check_len(op, "db", db.len(), d.d_out)?;
    }
    Ok(())
}

/// `Y[T,O] = X[T,I] W[O,I]^T (+ b[O])`, f32.
pub fn linear_forward(
    y: &mut [f32],
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    d: LinearDims,
) -> Result<()> {
    check_forward("linear_forward", d, y.len(), x.len(), w.len())?;
    if let Some(b) = b {
        check_len("linear_forward", "b", b.len(), d.d_out)?;
    }
    cpu::forward::<F32, _, _>(y, x, w, b, d)
}

/// Accumulates `dX += dY W`, `dW += dY^T X`, `db += sum_t dY` (each if present), f32.
/// `x` and `w` are the forward's inputs: `[T, I]` and `[O, I]`; `dy` is `[T, O]`.
pub fn linear_backward(
    g: LinearGrads,
    dy: &[f32],
    x: &[f32],
    w: &[f32],
    d: LinearDims,
) -> Result<()> {
    check_backward("linear_backward", d, &g, dy.len())?;
    check_len("linear_backward", "x", x.len(), d.t * d.d_in)?;
    check_len("linear_backward", "w", w.len(), d.d_out * d.d_in)?;
    cpu::backward::<F32, _, _, _>(g, dy, x, w, d)
}

/// `Y[T,O] = X[T,I] W[O,I]^T (+ b[O])` with bf16 inputs, f32 accumulation, f32 Y.
pub fn linear_forward_bf16<X: Bf16Elem, W: Bf16Elem>(
    y: &mut [f32],
    x: &[X],
    w: &[W],
    b: Option<&[W]>,
    d: LinearDims,
) -> Result<()> {
    check_forward("linear_forward_bf16", d, y.len(), x.len(), w.len())?;
    if let Some(b) = b {
        check_len("linear_forward_bf16", "b", b.len(), d.d_out)?;
    }
    cpu::forward::<Bf16, _, _>(y, x, w, b, d)
}

/// As [`linear_forward_bf16`], with Y stored as bf16 (rounded to nearest even from f32).
pub fn linear_forward_bf16_to_bf16<X: Bf16Elem, W: Bf16Elem>(
    y: &mut [bf16],
    x: &[X],
    w: &[W],
    b: Option<&[W]>,
    d: LinearDims,
) -> Result<()> {
    check_forward("linear_forward_bf16", d, y.len(), x.len(), w.len())?;
    if let Some(b) = b {
        check_len("linear_forward_bf16", "b", b.len(), d.d_out)?;
    }
    cpu::forward_bf16_to_bf16(y, x, w, b, d)
}

/// [`linear_backward`] with bf16 inputs (dY, X, W as bf16 or f32 rounded to bf16 in the
/// products), f32 accumulation and f32 gradients.
pub fn linear_backward_bf16<G: Bf16Elem, X: Bf16Elem, W: Bf16Elem>(
    g: LinearGrads,
    dy: &[G],
    x: &[X],
    w: &[W],
    d: LinearDims,
) -> Result<()> {
    check_backward("linear_backward_bf16", d, &g, dy.len())?;
    check_len("linear_backward_bf16", "x", x.len(), d.t * d.d_in)?;
    check_len("linear_backward_bf16", "w", w.len(), d.d_out * d.d_in)?;
    cpu::backward::<Bf16, _, _, _>(g, dy, x, w, d)
}
