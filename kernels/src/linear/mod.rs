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
//! One forward and one backward, generic over the storage types and taking the
//! [`Precision`] of the products:
//! - `F32`: everything f32 (a bf16 operand is a typed error, not a silent widening).
//! - `Bf16`: X, W, b and dY are [`Float`]s (bf16 storage, or f32 rounded to bf16 as the
//!   GEMM packs them, so f32 activation gradients can feed the bf16 products directly);
//!   products accumulate in f32; Y is written as f32 or rounded once to bf16, by its type;
//!   gradients are f32. The bias is added in f32 after the product, and db sums dY's own
//!   values in f32 (no bf16 rounding).

mod cpu;
pub mod device;
pub mod host;
pub(crate) mod npu;

#[cfg(test)]
mod tests;

use crate::cast;
use crate::error::{check_len, Result};
use crate::gemm::{not_f32, require_f32};
use crate::gemm::{Bf16, Precision, F32};
use cannon_runtime::BufferViewMut;
use cannon_runtime::Float;

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

/// The gradients a device-level backward ([`crate::ops::linear_backward`]) accumulates
/// into; `None` skips one.
pub struct LinearGradBufs<'a> {
    /// `[T, I]`
    pub dx: Option<BufferViewMut<'a, f32>>,
    /// `[O, I]`, e.g. a window of a layer's flat gradient buffer.
    pub dw: Option<BufferViewMut<'a, f32>>,
    /// `[O]`
    pub db: Option<BufferViewMut<'a, f32>>,
}

impl crate::backend::OnDevice for LinearGradBufs<'_> {
    fn devices(&self, out: &mut Vec<cannon_runtime::Device>) {
        for g in [&self.dx, &self.dw, &self.db] {
            g.devices(out);
        }
    }
}

impl LinearGradBufs<'_> {
    /// The slice-level gradients over the same (host) memory.
    pub(crate) fn host(&mut self) -> Result<LinearGrads<'_>> {
        Ok(LinearGrads {
            dx: host_opt(&mut self.dx)?,
            dw: host_opt(&mut self.dw)?,
            db: host_opt(&mut self.db)?,
        })
    }
}

/// The host slice of an optional CPU gradient view.
fn host_opt<'s>(v: &'s mut Option<BufferViewMut<'_, f32>>) -> Result<Option<&'s mut [f32]>> {
    Ok(v.as_mut().map(|v| v.as_host_slice_mut()).transpose()?)
}

impl LinearGrads<'_> {
    /// The lengths of the gradients present: dx, dw, db.
    fn lens(&self) -> [Option<usize>; 3] {
        [&self.dx, &self.dw, &self.db].map(|g| g.as_ref().map(|g| g.len()))
    }
}

impl LinearGradBufs<'_> {
    /// The lengths of the gradients present: dx, dw, db.
    pub(crate) fn lens(&self) -> [Option<usize>; 3] {
        [&self.dx, &self.dw, &self.db].map(|g| g.as_ref().map(|g| g.len()))
    }
}

/// The rules of [`linear_forward`](host::linear_forward) on every backend (the device-level entry point checks
/// them before any backend runs): y `[T, O]`, x `[T, I]`, w `[O, I]` and b `[O]` when given
/// (lengths), and f32 operands under `Precision::F32`.
pub(crate) fn check_forward<Y: Float, X: Float, W: Float>(
    p: Precision,
    d: LinearDims,
    y: usize,
    x: usize,
    w: usize,
    b: Option<usize>,
) -> Result<()> {
    let op = "linear_forward";
    check_len(op, "y", y, d.t * d.d_out)?;
    check_len(op, "x", x, d.t * d.d_in)?;
    check_len(op, "w", w, d.d_out * d.d_in)?;
    if let Some(b) = b {
        check_len(op, "b", b, d.d_out)?;
    }
    require_f32(op, p, &[("y", Y::DTYPE), ("x", X::DTYPE), ("w", W::DTYPE)])
}

/// The rules of [`linear_backward`](host::linear_backward) on every backend: dy `[T, O]`, the gradients present
/// (`[dx, dw, db]`, lengths) shaped as x, w and b, x `[T, I]`, w `[O, I]`, and f32 operands
/// under `Precision::F32`.
pub(crate) fn check_backward<G: Float, X: Float, W: Float>(
    p: Precision,
    d: LinearDims,
    [dx, dw, db]: [Option<usize>; 3],
    dy: usize,
    x: usize,
    w: usize,
) -> Result<()> {
    let op = "linear_backward";
    check_len(op, "dy", dy, d.t * d.d_out)?;
    if let Some(dx) = dx {
        check_len(op, "dx", dx, d.t * d.d_in)?;
    }
    if let Some(dw) = dw {
        check_len(op, "dw", dw, d.d_out * d.d_in)?;
    }
    if let Some(db) = db {
        check_len(op, "db", db, d.d_out)?;
    }
    check_len(op, "x", x, d.t * d.d_in)?;
    check_len(op, "w", w, d.d_out * d.d_in)?;
    require_f32(op, p, &[("dy", G::DTYPE), ("x", X::DTYPE), ("w", W::DTYPE)])
}
