//! Row gathers and scatters by a host index list, and the batched transpose: the data
//! movement of splicing rows into a sequence (image features into the `[IMG]` positions of the
//! text) and of regrouping rows (the projector's patch merge), with their backwards.
//!
//! ```text
//! gather_rows       out[i, :]       = src[idx[i], :]          out: [K, D]  src: [R, D]
//! scatter_rows      dst[idx[i], :]  = src[i, :]               dst: [R, D]  src: [K, D]
//! scatter_add_rows  dst[idx[i], :] += src[i, :]               (in order of i)
//! zero_rows         dst[idx[i], :]  = 0
//! transpose         out[b, c, r]    = x[b, r, c]              x: [B, R, C]  out: [B, C, R]
//!
//! idx: [K] host row indices, each < R
//! ```
//!
//! The indices are host data (the kernels' convention for index-like inputs, see
//! `crate::backend`): they are checked on the host, so an index past the buffer is a typed
//! error and never an out-of-bounds device access; the NPU path uploads them as int64.
//! Everything but `scatter_add_rows` moves values without arithmetic, so it is exact in any
//! type; `scatter_add_rows` adds in f32 and rounds once to the element type. With repeated
//! indices `scatter_rows` keeps the last row written and `scatter_add_rows` sums in index
//! order.

mod cpu;
pub mod device;
pub mod host;
pub mod npu;
#[cfg(test)]
mod tests;

use crate::error::{check_len, KernelError, Result};
use cannon_runtime::Element;
use cannon_runtime::Float;

/// Checks that `buf` holds whole rows of `dim` and every index is one of them; returns the
/// number of rows.
fn check_rows(
    op: &'static str,
    what: &str,
    len: usize,
    dim: usize,
    idx: &[usize],
) -> Result<usize> {
    if dim == 0 {
        return Err(KernelError::Shape {
            op,
            detail: "row length is 0".into(),
        });
    }
    if !len.is_multiple_of(dim) {
        return Err(KernelError::Shape {
            op,
            detail: format!("{what} has {len} elements, not whole rows of {dim}"),
        });
    }
    let rows = len / dim;
    if let Some((i, &r)) = idx.iter().enumerate().find(|(_, &r)| r >= rows) {
        return Err(KernelError::InvalidArgument {
            op,
            detail: format!("index {r} at position {i} is past the {rows} rows of {what}"),
        });
    }
    Ok(rows)
}

/// The shape of a batched transpose: `batch` matrices of `rows x cols`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransposeDims {
    pub batch: usize,
    pub rows: usize,
    pub cols: usize,
}

impl TransposeDims {
    fn len(&self) -> Option<usize> {
        self.batch.checked_mul(self.rows)?.checked_mul(self.cols)
    }
}

// The rules of the ops on every backend (the device-level entry points check them before
// any backend runs), on the operands' lengths.

/// [`gather_rows`](host::gather_rows): src of whole rows of `dim`, every index one of them, out of
/// `idx.len()` rows. Gives src's rows.
pub(crate) fn check_gather_rows(
    out: usize,
    src: usize,
    idx: &[usize],
    dim: usize,
) -> Result<usize> {
    let rows = check_rows("gather_rows", "src", src, dim, idx)?;
    check_len("gather_rows", "out", out, idx.len() * dim)?;
    Ok(rows)
}

/// [`scatter_rows`](host::scatter_rows) and [`scatter_add_rows`](host::scatter_add_rows) (`op`): dst of whole rows of `dim`, every index
/// one of them, src of `idx.len()` rows. Gives dst's rows.
pub(crate) fn check_scatter_rows(
    op: &'static str,
    dst: usize,
    src: usize,
    idx: &[usize],
    dim: usize,
) -> Result<usize> {
    let rows = check_rows(op, "dst", dst, dim, idx)?;
    check_len(op, "src", src, idx.len() * dim)?;
    Ok(rows)
}

/// [`zero_rows`](host::zero_rows): dst of whole rows of `dim`, every index one of them. Gives dst's rows.
pub(crate) fn check_zero_rows(dst: usize, idx: &[usize], dim: usize) -> Result<usize> {
    check_rows("zero_rows", "dst", dst, dim, idx)
}

/// [`transpose`](host::transpose): x and out of `batch * rows * cols` values (which must not overflow).
/// Gives that count.
pub(crate) fn check_transpose(out: usize, x: usize, d: TransposeDims) -> Result<usize> {
    let n = d.len().ok_or_else(|| KernelError::Shape {
        op: "transpose",
        detail: format!("{d:?} overflows"),
    })?;
    check_len("transpose", "x", x, n)?;
    check_len("transpose", "out", out, n)?;
    Ok(n)
}
