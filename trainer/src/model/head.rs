//! The lm_head and the loss, full or chunked, on device tensors.
//!
//! ```text
//! logits[T,V] = xf[T,D] lm_head[V,D]^T
//! loss        = mean over targets != IGNORE_INDEX of  lse(logits[t]) - logits[t, target[t]]
//! ```
//!
//! Full ([`LossMode::Full`]): the forward materialises the logits and writes d loss / d logits
//! with the loss; the backward is the lm_head's linear backward. A training forward
//! overwrites the logits with their gradient (`ops::cross_entropy_in_place`: one `[T,V]`
//! tensor, bit-identical gradient); a forward that keeps the logits for its caller (verify,
//! eval) writes the gradient beside them (`ops::cross_entropy`: two).
//!
//! Chunked ([`LossMode::Chunked`]): no `[T,V]` tensor ever exists. The forward makes the
//! logits of `rows` tokens at a time into one `[rows,V]` tensor (the lm_head GEMM per chunk)
//! and takes their loss without gradient; the backward makes them again, overwrites them
//! with their gradient (`ops::cross_entropy_in_place`) and hands it straight to the lm_head
//! backward (`dxf[rows] += dl W`, `dW += dl^T xf[rows]`): one more lm_head GEMM for at most
//! `rows x V` floats instead of `T x V`. Both divide by the count of
//! the whole batch's targets, and skip chunks whose targets are all ignored, as the kernels'
//! `cross_entropy_chunked` does.
//!
//! The divisor can be given instead ([`LossNorm::Divisor`]): gradient accumulation divides
//! every micro batch's summed loss by the trained targets of the whole optimizer step (HF's
//! `num_items_in_batch`), so that K micro batches give the gradient of one batch of all their
//! rows, not the mean of K means.

use super::params::{ParamLayout, TextHead};
use super::precision::{linear, linear_back, ActElem};
use super::source::GroupWeights;
use cannon_kernels::cross_entropy::{LossNorm, IGNORE_INDEX};
use cannon_kernels::device_ctx::DeviceCtx;
use cannon_kernels::{ops, KernelError, Tensor};
use cannon_runtime::trace::{self, Cat};
use cannon_runtime::BufferView;
use std::ops::Range;

type Result<T> = std::result::Result<T, KernelError>;

/// How the loss is computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LossMode {
    /// Full `[T,V]` logits.
    #[default]
    Full,
    /// At most this many rows of logits at a time (> 0).
    Chunked(usize),
}

/// What the head's forward keeps.
#[derive(Debug)]
pub struct HeadActs {
    /// `[T,V]` logits (full mode, when kept).
    pub logits: Option<Tensor<f32>>,
    /// `[T,V]` d loss / d logits (full mode only).
    pub dlogits: Option<Tensor<f32>>,
    /// Summed loss over the targets divided by the divisor (the mean by default).
    pub loss: f64,
    /// Summed loss over the targets (for reductions across micro batches or ranks).
    pub sum: f64,
    /// Targets that count in the sum.
    pub targets: usize,
    /// What the sum (and so the gradient) was divided by.
    pub norm: LossNorm,
}

/// The row chunks of `targets` that hold a trained target, `rows` at a time.
fn chunks(targets: &[i32], rows: usize) -> impl Iterator<Item = Range<usize>> + '_ {
    let n = targets.len();
    (0..n)
        .step_by(rows.max(1))
        .map(move |r0| r0..(r0 + rows).min(n))
        .filter(|r| targets[r.clone()].iter().any(|&l| l != IGNORE_INDEX))
}

/// The number of trained targets (the divisor of the mean), checked like the kernels do.
fn count(targets: &[i32]) -> usize {
    targets.iter().filter(|&&l| l != IGNORE_INDEX).count()
}

/// The divisor `norm` stands for with `n` trained targets (`Mean`: `n`, and 0 targets give a
/// zero loss); a given divisor must be positive and finite.
fn divisor(norm: LossNorm, n: usize) -> Result<f64> {
    match norm {
        LossNorm::Mean => Ok(n as f64),
        LossNorm::Divisor(x) if x > 0.0 && x.is_finite() => Ok(x),
        LossNorm::Divisor(x) => Err(KernelError::InvalidArgument {
            op: "head::forward",
            detail: format!("loss divisor {x} must be positive and finite"),
        }),
    }
}

/// What the full loss's head leaves for the caller (the chunked loss keeps neither).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// The gradient, written over the logits (a training step: one `[T, V]` tensor).
    Grad,
    /// The logits and, beside them, their gradient (verify's forward and backward).
    KeptWithGrad,
    /// The logits alone, no gradient (the held-out evaluation: no backward follows).
    Kept,
}

/// Logits and loss of `xf [T,D]` against `targets [T]` (`IGNORE_INDEX` = ignored), the summed
/// loss divided as `norm` says; with the full loss, `out` says what is left of the logits.
#[allow(clippy::too_many_arguments)]
pub fn forward<A: ActElem>(
    exec: &DeviceCtx,
    mode: LossMode,
    xf: &Tensor<A>,
    w: &BufferView<'_, f32>,
    targets: &[i32],
    (d, v): (usize, usize),
    norm: LossNorm,
    out: Logits,
) -> Result<HeadActs> {
    let st = exec.stream();
    let _span = trace::span("head forward", Cat::Layer);
    let t = targets.len();
    match mode {
        LossMode::Full => {
            let mut logits = exec.empty(&[t, v])?;
            linear(st, &mut logits.view_mut(), &xf.view(), w, d, v)?;
            let (logits, dlogits, ce) = match out {
                Logits::KeptWithGrad => {
                    let mut dlogits = exec.empty(&[t, v])?;
                    let mut dl = dlogits.view_mut();
                    let ce =
                        ops::cross_entropy(st, &logits.view(), targets, v, Some(&mut dl), norm)?;
                    (Some(logits), Some(dlogits), ce)
                }
                Logits::Kept => {
                    let ce = ops::cross_entropy(st, &logits.view(), targets, v, None, norm)?;
                    (Some(logits), None, ce)
                }
                Logits::Grad => {
                    let mut l = logits.view_mut();
                    let ce = ops::cross_entropy_in_place(st, &mut l, targets, v, norm)?;
                    (None, Some(logits), ce)
                }
            };
            Ok(HeadActs {
                logits,
                dlogits,
                loss: ce.loss,
                sum: ce.sum,
                targets: ce.count,
                norm,
            })
        }
        LossMode::Chunked(rows) => {
            let n = count(targets);
            let div = divisor(norm, n)?;
            let mut sum = 0.0;
            if n > 0 {
                let mut buf = exec.empty::<f32>(&[rows.min(t), v])?;
                for r in chunks(targets, rows) {
                    let mut logits = buf.rows_mut(0..r.len())?;
                    let x = xf.rows(r.clone())?;
                    linear(st, &mut logits, &x, w, d, v)?;
                    let norm = LossNorm::Divisor(div);
                    let lab = &targets[r];
                    let ce = ops::cross_entropy(st, &logits.as_view(), lab, v, None, norm)?;
                    sum += ce.sum;
                }
            }
            Ok(HeadActs {
                logits: None,
                dlogits: None,
                loss: if n > 0 { sum / div } else { 0.0 },
                sum,
                targets: n,
                norm,
            })
        }
    }
}

/// Backward of the loss through the lm_head: `dxf [T,D] += d loss / d xf` and, if given,
/// `dw [V,D] += d loss / d lm_head`.
#[allow(clippy::too_many_arguments)]
pub fn backward<A: ActElem>(
    exec: &DeviceCtx,
    mode: LossMode,
    h: &HeadActs,
    xf: &Tensor<A>,
    w: &BufferView<'_, f32>,
    targets: &[i32],
    (d, v): (usize, usize),
    dxf: &mut Tensor<f32>,
    mut dw: Option<cannon_runtime::BufferViewMut<'_, f32>>,
) -> Result<()> {
    let st = exec.stream();
    let _span = trace::span("head backward", Cat::Layer);
    match (mode, &h.dlogits) {
        (LossMode::Full, Some(dl)) => linear_back(
            st,
            Some(dxf.view_mut()),
            dw,
            &dl.view(),
            &xf.view(),
            w,
            d,
            v,
        ),
        (LossMode::Chunked(rows), _) => {
            let n = count(targets);
            if n == 0 {
                return Ok(());
            }
            let div = divisor(h.norm, n)?;
            let mut buf = exec.empty::<f32>(&[rows.min(targets.len()), v])?;
            for r in chunks(targets, rows) {
                let mut logits = buf.rows_mut(0..r.len())?;
                let x = xf.rows(r.clone())?;
                linear(st, &mut logits, &x, w, d, v)?;
                let norm = LossNorm::Divisor(div);
                ops::cross_entropy_in_place(st, &mut logits, &targets[r.clone()], v, norm)?;
                let dx = Some(dxf.rows_mut(r)?);
                let dwv = dw
                    .as_mut()
                    .map(|dw| dw.slice_mut(0..dw.len()))
                    .transpose()?;
                linear_back(st, dx, dwv, &logits.as_view(), &x, w, d, v)?;
            }
            Ok(())
        }
        (LossMode::Full, None) => Err(KernelError::InvalidArgument {
            op: "head::backward",
            detail: "full-loss activations without d logits".into(),
        }),
    }
}

/// The head group's tensors in a fetched buffer.
pub(crate) fn head_view<'w>(
    layout: &ParamLayout,
    w: &'w GroupWeights<'_>,
) -> Result<TextHead<BufferView<'w, f32>>> {
    let g = layout.text_head();
    TextHead::split(w.view()?, &layout.groups[g])
}
