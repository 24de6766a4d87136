//! Cross-entropy's NPU bodies (aclnn_cross_entropy_loss{,_grad}.h; docs/cann-api.md §4).
//!
//! Every body checks and counts the labels on the host as the slice-level calls do (and
//! handles `Mean` over no label there: loss 0, zero gradient), uploads them as int64, then:
//!
//! ```text
//! losses[N]       = aclnnCrossEntropyLoss(logits, labels, weight null, reduction "none",
//!                   ignoreIndex -100, labelSmoothing 0, no z-loss; logProbOut [N, V] kept for
//!                   the gradient; the z-loss outputs, which must be passed, are [N] scratch)
//! loss, sum       = losses copied to the host and summed in f64 in row order (as the CPU)
//! d_logits[N, V]  = aclnnCrossEntropyLossGrad(gradLoss = 1/divisor on every row, logProb,
//!                   labels, reduction "none", ignoreIndex -100)   (ignored rows get 0)
//! ```
//!
//! The chunked lm_head loss runs that per block of rows with the logits from
//! `gemm::npu` (`h[rows] W^T`) and the lm_head backward (`dh[rows] += dl W`,
//! `dW += dl^T h[rows]`) on the same composition.
#![cfg_attr(
    not(feature = "npu"),
    allow(unused_variables, unused_imports, dead_code)
)]

use super::{CeStats, LmHeadGrads, LossNorm};
use crate::backend::npu_body;
use crate::error::Result;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

#[cfg(feature = "npu")]
mod imp {
    use super::*;
    use crate::backend::aclnn::{aclnn, AclTensor};
    use cannon_runtime::DeviceBuffer;
    use std::ffi::c_void;

    /// The per-row losses of `logits` `[n, v]` (device address) and, when `grad` names a
    /// destination `[n, v]` (which may be the logits themselves), d logits scaled by `scale`.
    pub(super) fn rows(
        op: &'static str,
        stream: &Stream,
        logits: *mut c_void,
        labels: &[i32],
        v: usize,
        grad: Option<*mut c_void>,
        scale: f32,
    ) -> Result<Vec<f32>> {
        let n = labels.len();
        let tgt: Vec<i64> = labels.iter().map(|&l| l as i64).collect();
        let mut tgt = DeviceBuffer::<i64>::clone_htod(stream, &tgt)?;
        let mut losses = DeviceBuffer::<f32>::alloc(stream, n)?;
        let mut logp = DeviceBuffer::<f32>::alloc(stream, n * v)?;
        let mut z = DeviceBuffer::<f32>::alloc(stream, n)?;
        let dims = [n as i64, v as i64];
        // SAFETY: the caller's logits/gradient view of n * v f32 values, alive across the call.
        let xt = unsafe { AclTensor::strided::<f32>(op, logits, &dims, &[v as i64, 1], &dims) }?;
        let tt = AclTensor::from_buffer(op, &mut tgt, &[n])?;
        let lt = AclTensor::from_buffer(op, &mut losses, &[n])?;
        let pt = AclTensor::from_buffer(op, &mut logp, &[n, v])?;
        let zt = AclTensor::from_buffer(op, &mut z, &[n])?;
        let mut z2 = DeviceBuffer::<f32>::alloc(stream, n)?;
        let zt2 = AclTensor::from_buffer(op, &mut z2, &[n])?;
        let mut none = *b"none\0";
        let red = none.as_mut_ptr() as *mut std::ffi::c_char;
        aclnn!(
            op,
            stream,
            aclnnCrossEntropyLossGetWorkspaceSize,
            aclnnCrossEntropyLoss,
            (
                xt.raw(),
                tt.raw(),
                std::ptr::null(),
                red,
                super::super::IGNORE_INDEX as i64,
                0.0,
                0.0,
                false,
                lt.raw(),
                pt.raw(),
                zt.raw(),
                zt2.raw()
            )
        )?;
        if let Some(g) = grad {
            let mut gl = DeviceBuffer::<f32>::clone_htod(stream, &vec![scale; n])?;
            let gt = AclTensor::from_buffer(op, &mut gl, &[n])?;
            // SAFETY: the caller's logits/gradient view of n * v f32 values, alive across the call.
            let ot = unsafe { AclTensor::strided::<f32>(op, g, &dims, &[v as i64, 1], &dims) }?;
            aclnn!(
                op,
                stream,
                aclnnCrossEntropyLossGradGetWorkspaceSize,
                aclnnCrossEntropyLossGrad,
                (
                    gt.raw(),
                    pt.raw(),
                    tt.raw(),
                    std::ptr::null(),
                    std::ptr::null(),
                    std::ptr::null(),
                    red,
                    super::super::IGNORE_INDEX as i64,
                    0.0,
                    0.0,
                    ot.raw()
                )
            )?;
        }
        // clone_dtoh waits for the stream: the losses are final.
        Ok(losses.clone_dtoh(stream)?)
    }

    /// Row losses (f32, ignored rows 0) summed left to right in f64 onto `sum`.
    pub(super) fn add_rows(sum: f64, losses: &[f32], labels: &[i32]) -> f64 {
        losses
            .iter()
            .zip(labels)
            .filter(|(_, &l)| l != super::super::IGNORE_INDEX)
            .fold(sum, |s, (&x, _)| s + x as f64)
    }
}

/// `aclnnCrossEntropyLoss` (+ `aclnnCrossEntropyLossGrad` into `d_logits` when given).
pub fn full(
    ordinal: u32,
    stream: &Stream,
    logits: &BufferView<'_, f32>,
    labels: &[i32],
    vocab: usize,
    d_logits: Option<&mut BufferViewMut<'_, f32>>,
    norm: LossNorm,
) -> Result<CeStats> {
    const OP: &str = "cross_entropy";
    npu_body!(
        OP,
        ordinal,
        "aclnnCrossEntropyLoss (+ aclnnCrossEntropyLossGrad)",
        {
            let d_len = d_logits.as_ref().map(|d| d.len());
            let (count, div) = super::check_full(OP, labels, vocab, logits.len(), d_len, norm)?;
            let Some(div) = div.filter(|_| !labels.is_empty()) else {
                if let Some(d) = d_logits {
                    d.memset_zeros(stream)?;
                }
                return Ok(CeStats {
                    loss: 0.0,
                    sum: 0.0,
                    count,
                });
            };
            let grad = d_logits.map(|d| d.as_raw_mut_ptr() as *mut std::ffi::c_void);
            let losses = imp::rows(
                OP,
                stream,
                logits.as_raw_ptr() as *mut _,
                labels,
                vocab,
                grad,
                (1.0 / div) as f32,
            )?;
            let sum = imp::add_rows(0.0, &losses, labels);
            Ok(CeStats {
                loss: sum / div,
                sum,
                count,
            })
        }
    )
}

/// As [`full`], with aclnnCrossEntropyLossGrad writing into `logits` itself (its input is
/// logProb, so the logits are no longer read by then).
pub fn in_place(
    ordinal: u32,
    stream: &Stream,
    logits: &mut BufferViewMut<'_, f32>,
    labels: &[i32],
    vocab: usize,
    norm: LossNorm,
) -> Result<CeStats> {
    const OP: &str = "cross_entropy_in_place";
    npu_body!(
        OP,
        ordinal,
        "aclnnCrossEntropyLoss + aclnnCrossEntropyLossGrad",
        {
            let (count, div) = super::check_full(OP, labels, vocab, logits.len(), None, norm)?;
            let Some(div) = div.filter(|_| !labels.is_empty()) else {
                logits.memset_zeros(stream)?;
                return Ok(CeStats {
                    loss: 0.0,
                    sum: 0.0,
                    count,
                });
            };
            let p = logits.as_raw_mut_ptr() as *mut std::ffi::c_void;
            let losses = imp::rows(OP, stream, p, labels, vocab, Some(p), (1.0 / div) as f32)?;
            let sum = imp::add_rows(0.0, &losses, labels);
            Ok(CeStats {
                loss: sum / div,
                sum,
                count,
            })
        }
    )
}

/// Per block of `chunk_rows` rows (blocks whose labels are all ignored skipped, as on the
/// CPU): `logits = h[rows] w^T` (gemm::npu, f32) into one `[chunk_rows, V]` scratch,
/// cross-entropy with the gradient in place, then `dh[rows] += dl w`, `dw += dl^T h[rows]`.
/// Row losses are summed in f64 in row order across blocks, as on the CPU.
#[allow(clippy::too_many_arguments)]
pub fn chunked_lm_head(
    ordinal: u32,
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
    const OP: &str = "cross_entropy_chunked";
    npu_body!(
        OP,
        ordinal,
        "aclnnMatmul + aclnnCrossEntropyLoss (+ aclnnCrossEntropyLossGrad) per chunk",
        {
            use crate::gemm::npu::imp as g;
            use crate::gemm::{Dims, Trans};
            use cannon_runtime::DeviceBuffer;
            let mut grads = grads;
            grads.check(h.len(), w.len(), labels.len(), d_model, vocab)?;
            let (count, div) = super::check_chunked(labels, vocab, chunk_rows, norm)?;
            let Some(div) = div else {
                return Ok(CeStats {
                    loss: 0.0,
                    sum: 0.0,
                    count,
                });
            };
            let with_grad = grads.dh.is_some() || grads.dw.is_some();
            let scale = (1.0 / div) as f32;
            let chunk = chunk_rows.min(labels.len()).max(1);
            let mut buf = DeviceBuffer::<f32>::alloc(stream, chunk * vocab)?;
            let mut sum = 0.0f64;
            for r0 in (0..labels.len()).step_by(chunk) {
                let r1 = (r0 + chunk).min(labels.len());
                let lab = &labels[r0..r1];
                if lab.iter().all(|&l| l == super::IGNORE_INDEX) {
                    continue;
                }
                let n = lab.len();
                let hr = h.slice(r0 * d_model..r1 * d_model)?;
                let mut lv = buf.slice_mut(0..n * vocab)?;
                let dims = Dims {
                    m: n,
                    n: vocab,
                    k: d_model,
                };
                g::gemm(
                    OP,
                    stream,
                    false,
                    Trans::N,
                    Trans::T,
                    dims,
                    1.0,
                    &hr,
                    d_model,
                    w,
                    d_model,
                    0.0,
                    &mut lv,
                    vocab,
                )?;
                let p = lv.as_raw_mut_ptr() as *mut std::ffi::c_void;
                let losses = imp::rows(OP, stream, p, lab, vocab, with_grad.then_some(p), scale)?;
                sum = imp::add_rows(sum, &losses, lab);
                if with_grad {
                    let dl = buf.slice(0..n * vocab)?;
                    if let Some(dh) = grads.dh.as_mut() {
                        let mut dhr = dh.slice_mut(r0 * d_model..r1 * d_model)?;
                        let dims = Dims {
                            m: n,
                            n: d_model,
                            k: vocab,
                        };
                        g::gemm(
                            OP,
                            stream,
                            false,
                            Trans::N,
                            Trans::N,
                            dims,
                            1.0,
                            &dl,
                            vocab,
                            w,
                            d_model,
                            1.0,
                            &mut dhr,
                            d_model,
                        )?;
                    }
                    if let Some(dw) = grads.dw.as_mut() {
                        let dims = Dims {
                            m: vocab,
                            n: d_model,
                            k: n,
                        };
                        g::gemm(
                            OP,
                            stream,
                            false,
                            Trans::T,
                            Trans::N,
                            dims,
                            1.0,
                            &dl,
                            vocab,
                            &hr,
                            d_model,
                            1.0,
                            dw,
                            d_model,
                        )?;
                    }
                }
            }
            Ok(CeStats {
                loss: sum / div,
                sum,
                count,
            })
        }
    )
}
