//! RMSNorm, as transformers' `MistralRMSNorm` / `PixtralRMSNorm`:
//!
//! ```text
//! forward   rstd[t]  = 1 / sqrt(mean_j x[t,j]^2 + eps)                     (f32)
//!           n[t,j]   = round_E(x[t,j] * rstd[t])                           (f32, then to E)
//!           out[t,j] = round_E(w[j] * n[t,j])
//! backward  dw[j]   += sum_t dout[t,j] * n[t,j]
//!           dx[t,j] += rstd[t] * (g[t,j] - xh[t,j] * mean_k(g[t,k] * xh[t,k]))
//!                      where g = dout * w, xh = x * rstd (unrounded)
//!
//! x, out, dout, dx: [T, D]   w: [D]   rstd: [T] f32 (saved by forward)   dw: [D] f32
//! ```
//!
//! The normalisation is done in f32 and, for bf16 (`E = bf16`), rounded to bf16 *before* the
//! multiplication by the weight, which is then a bf16 x bf16 product rounded to bf16 — the
//! order transformers uses (`weight * hidden.to(input_dtype)`), which matters for bf16 parity.
//! For f32 both roundings are the identity.
//!
//! Both gradients **accumulate** (`dx +=`, `dw +=`, as llm.c): dx can be the residual stream's
//! gradient, dw the flat gradient buffer; zero them first where that is not wanted. dw sums
//! rows in fixed blocks whose size depends only on (T, D), so it is bit-reproducible across
//! thread counts.

mod cpu;
pub mod device;
pub mod host;
pub(crate) mod npu;
#[cfg(test)]
mod tests;

use crate::error::{check_len, KernelError, Result};
use cannon_runtime::Float;

const OP_FWD: &str = "rmsnorm_forward";
const OP_BWD: &str = "rmsnorm_backward";

/// Rows of `x` given its length and the hidden size, or a shape error.
fn rows(op: &'static str, len: usize, dim: usize) -> Result<usize> {
    if dim == 0 || !len.is_multiple_of(dim) {
        return Err(KernelError::Shape {
            op,
            detail: format!("x has {len} elements, not a multiple of the hidden size {dim}"),
        });
    }
    Ok(len / dim)
}

/// The rules of [`rmsnorm_forward`](host::rmsnorm_forward) on every backend (the device-level entry point checks
/// them before any backend runs): x of whole rows of `dim`, out as long as x, one rstd per
/// row and weight `[dim]` (lengths given). Gives the rows.
pub(crate) fn check_forward(
    out: usize,
    rstd: usize,
    x: usize,
    weight: usize,
    dim: usize,
) -> Result<usize> {
    let t = rows(OP_FWD, x, dim)?;
    check_len(OP_FWD, "out", out, x)?;
    check_len(OP_FWD, "rstd", rstd, t)?;
    check_len(OP_FWD, "weight", weight, dim)?;
    Ok(t)
}

/// The rules of [`rmsnorm_backward`](host::rmsnorm_backward) on every backend: as [`check_forward`]'s for x, rstd
/// and weight, with dx and dout as long as x and dweight `[dim]`. Gives the rows.
pub(crate) fn check_backward(
    dx: usize,
    dweight: usize,
    dout: usize,
    x: usize,
    weight: usize,
    rstd: usize,
    dim: usize,
) -> Result<usize> {
    let t = rows(OP_BWD, x, dim)?;
    check_len(OP_BWD, "dx", dx, x)?;
    check_len(OP_BWD, "dout", dout, x)?;
    check_len(OP_BWD, "rstd", rstd, t)?;
    check_len(OP_BWD, "weight", weight, dim)?;
    check_len(OP_BWD, "dweight", dweight, dim)?;
    Ok(t)
}
