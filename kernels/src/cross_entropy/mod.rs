//! Softmax cross-entropy over rows of logits, with `ignore_index = -100`, as transformers'
//! `ForCausalLMLoss` (logits upcast to f32, labels already shifted by the caller).
//!
//! ```text
//! lse[n]   = log sum_v exp(logits[n, v])
//! loss     = sum_{n : labels[n] != -100} (lse[n] - logits[n, labels[n]]) / divisor
//! d_logits[n, v] = (softmax(logits[n])[v] - [v == labels[n]]) / divisor   (0 on ignored rows)
//!
//! logits, d_logits: [N, V] f32   labels: [N] i32 (-100 or in 0..V)
//! ```
//!
//! The divisor is the number of non-ignored labels of the call ([`LossNorm::Mean`], torch's
//! `reduction="mean"`), or a count the caller gives ([`LossNorm::Divisor`], HF's
//! `num_items_in_batch`: the non-ignored labels of every micro-batch and rank of one optimizer
//! step, so that summing the per-micro-batch gradients gives the gradient of the step's mean).
//! `d_logits` is the gradient of the returned `loss`, i.e. already scaled by `1 / divisor`;
//! it is **written**, not accumulated (it is a fresh activation gradient).
//!
//! Convention for a call with no non-ignored label under `Mean`: loss 0 and a zero gradient
//! (torch returns NaN there; a padding-only micro-batch must not poison the step).
//!
//! Two ways to run it:
//! - [`cross_entropy`](host::cross_entropy) / [`cross_entropy_in_place`](host::cross_entropy_in_place) on a full `[N, V]` logits buffer;
//! - [`cross_entropy_chunked`](host::cross_entropy_chunked), which never holds more than `chunk_rows x V` logits: a
//!   [`ChunkedLogits`] implementation produces the logits of a block of rows (e.g. the lm_head
//!   GEMM `h[rows] W^T`) and consumes their gradient (`dh[rows] += dl W`, `dW += dl^T h`).
//!   Both paths sum the per-row losses in row order in f64, so they agree bit for bit.

mod cpu;
pub mod device;
pub mod host;
mod lm_head;
pub(crate) mod npu;
#[cfg(test)]
mod tests;

use crate::error::{check_len, KernelError, Result};
use std::ops::Range;

pub(crate) use lm_head::LmHeadCpu;
pub use lm_head::LmHeadGrads;

/// The label value whose rows carry no loss (torch's default `ignore_index`).
pub const IGNORE_INDEX: i32 = -100;

/// How the summed loss (and so the gradient) is normalised.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LossNorm {
    /// Divide by the number of non-ignored labels of this call; none gives loss 0, grad 0.
    Mean,
    /// Divide by this count (> 0, finite), e.g. the non-ignored labels of the whole step.
    Divisor(f64),
}

/// What one call computed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CeStats {
    /// `sum / divisor` (0 when nothing was counted under `Mean`).
    pub loss: f64,
    /// Sum of the per-row losses over non-ignored rows (for reductions across ranks).
    pub sum: f64,
    /// Number of non-ignored labels.
    pub count: usize,
}

impl CeStats {
    /// What a call on the meta device reports: the labels' count, a loss of 0 (no logits
    /// exist to take it from).
    pub fn of_labels(labels: &[i32]) -> Self {
        CeStats {
            loss: 0.0,
            sum: 0.0,
            count: labels.iter().filter(|&&l| l != IGNORE_INDEX).count(),
        }
    }
}

/// Produces and consumes the logits of a block of rows for [`cross_entropy_chunked`](host::cross_entropy_chunked).
pub trait ChunkedLogits {
    type Error: From<KernelError>;
    /// Writes the f32 logits of `rows` into `out`: `[rows.len(), V]`, row-major.
    fn logits(
        &mut self,
        rows: Range<usize>,
        out: &mut [f32],
    ) -> std::result::Result<(), Self::Error>;
    /// Receives d loss / d logits of the same rows, `[rows.len(), V]` (already divided by
    /// the divisor). Only called when the gradient was asked for.
    fn backward(
        &mut self,
        rows: Range<usize>,
        d_logits: &[f32],
    ) -> std::result::Result<(), Self::Error>;
}

/// Checks the labels and counts the non-ignored ones.
fn count_labels(op: &'static str, labels: &[i32], vocab: usize) -> Result<usize> {
    if vocab == 0 {
        return Err(KernelError::Shape {
            op,
            detail: "vocab is 0".into(),
        });
    }
    let mut count = 0;
    for (n, &l) in labels.iter().enumerate() {
        if l == IGNORE_INDEX {
            continue;
        }
        if l < 0 || l as usize >= vocab {
            return Err(KernelError::InvalidArgument {
                op,
                detail: format!("label {l} at row {n} is neither {IGNORE_INDEX} nor in 0..{vocab}"),
            });
        }
        count += 1;
    }
    Ok(count)
}

/// The divisor for `norm`, or `None` when nothing is to be computed (Mean over no label).
fn divisor(op: &'static str, norm: LossNorm, count: usize) -> Result<Option<f64>> {
    match norm {
        LossNorm::Mean if count == 0 => Ok(None),
        LossNorm::Mean => Ok(Some(count as f64)),
        LossNorm::Divisor(d) if d > 0.0 && d.is_finite() => Ok(Some(d)),
        LossNorm::Divisor(d) => Err(KernelError::InvalidArgument {
            op,
            detail: format!("divisor must be positive and finite, got {d}"),
        }),
    }
}

/// The rules of [`cross_entropy`](host::cross_entropy) (`op`, `d_logits` given or not) and of
/// [`cross_entropy_in_place`](host::cross_entropy_in_place) (no `d_logits`) on every backend (the device-level entry
/// points check them before any backend runs): a vocabulary of at least one, every label
/// `IGNORE_INDEX` or inside it, logits `[N, V]` and d_logits as long as the logits (lengths
/// given), a valid `norm`. Gives the non-ignored count and the divisor (`None`: `Mean` over
/// no label, nothing to compute).
pub(crate) fn check_full(
    op: &'static str,
    labels: &[i32],
    vocab: usize,
    logits: usize,
    d_logits: Option<usize>,
    norm: LossNorm,
) -> Result<(usize, Option<f64>)> {
    let count = count_labels(op, labels, vocab)?;
    check_len(op, "logits", logits, labels.len() * vocab)?;
    if let Some(d) = d_logits {
        check_len(op, "d_logits", d, logits)?;
    }
    Ok((count, divisor(op, norm, count)?))
}

/// The rules of [`cross_entropy_chunked`](host::cross_entropy_chunked) on every backend (with the lm_head's lengths,
/// `LmHeadGrads::check`, for [`crate::ops::cross_entropy_lm_head`]): the labels as
/// [`check_full`]'s, `chunk_rows` at least 1, a valid `norm`. Gives what `check_full` gives.
pub(crate) fn check_chunked(
    labels: &[i32],
    vocab: usize,
    chunk_rows: usize,
    norm: LossNorm,
) -> Result<(usize, Option<f64>)> {
    let op = "cross_entropy_chunked";
    let count = count_labels(op, labels, vocab)?;
    if chunk_rows == 0 {
        return Err(KernelError::InvalidArgument {
            op,
            detail: "chunk_rows is 0".into(),
        });
    }
    Ok((count, divisor(op, norm, count)?))
}
