//! Cross-entropy over runtime buffers: the CPU path is the slice-level functions on the host
//! slices, the NPU path [`super::npu`].
//!
//! ```text
//! logits, d_logits: [N, V] f32   labels: [N] i32 (host; -100 or in 0..V)
//! lm_head form: h: [N, D] f32   w: [V, D] f32   dh: [N, D] f32   dw: [V, D] f32
//! ```
//!
//! The labels are a host slice: they are checked and counted on the host (the divisor of
//! [`LossNorm::Mean`] is a host number either way) and the NPU path uploads them.

use super::{
    cross_entropy, cross_entropy_chunked, cross_entropy_in_place, npu, CeStats, ChunkedLogits,
    LossNorm,
};
use crate::device::{backend, present, Backend};
use crate::error::{check_len, KernelError, Result};
use crate::linear::{linear_backward, linear_forward, LinearDims, LinearGrads};
use cannon_runtime::{BufferView, BufferViewMut, Device, Stream};
use std::ops::Range;

/// [`cross_entropy`] on `stream`'s device; writes the gradient into `d_logits` when given.
pub fn full(
    stream: &Stream,
    logits: &BufferView<'_, f32>,
    labels: &[i32],
    vocab: usize,
    mut d_logits: Option<&mut BufferViewMut<'_, f32>>,
    norm: LossNorm,
) -> Result<CeStats> {
    let devices = present(&[logits.device()], &[d_logits.as_ref().map(|d| d.device())]);
    match backend("cross_entropy", stream, &devices)? {
        Backend::Cpu => cross_entropy(
            logits.as_host_slice()?,
            labels,
            vocab,
            d_logits
                .as_mut()
                .map(|d| d.as_host_slice_mut())
                .transpose()?,
            norm,
        ),
        Backend::Npu(ordinal) => npu::full(ordinal, stream, logits, labels, vocab, d_logits, norm),
    }
}

/// [`cross_entropy_in_place`] on `stream`'s device: `logits` is overwritten by d_logits.
pub fn in_place(
    stream: &Stream,
    logits: &mut BufferViewMut<'_, f32>,
    labels: &[i32],
    vocab: usize,
    norm: LossNorm,
) -> Result<CeStats> {
    match backend("cross_entropy_in_place", stream, &[logits.device()])? {
        Backend::Cpu => cross_entropy_in_place(logits.as_host_slice_mut()?, labels, vocab, norm),
        Backend::Npu(ordinal) => npu::in_place(ordinal, stream, logits, labels, vocab, norm),
    }
}

/// The gradients of the lm_head form; `None` skips one. Both accumulate.
pub struct LmHeadGrads<'a> {
    /// `[N, D]`
    pub dh: Option<BufferViewMut<'a, f32>>,
    /// `[V, D]`
    pub dw: Option<BufferViewMut<'a, f32>>,
}

impl LmHeadGrads<'_> {
    fn devices(&self) -> [Option<Device>; 2] {
        [
            self.dh.as_ref().map(|v| v.device()),
            self.dw.as_ref().map(|v| v.device()),
        ]
    }
}

/// [`cross_entropy_chunked`] on `stream`'s device with the logits of the lm_head,
/// `logits[rows] = h[rows] w^T` (f32), made `chunk_rows` rows at a time; the gradient, when
/// `grads` asks for any, goes to `dh[rows] += dl w` and `dw += dl^T h[rows]`. Never holds
/// more than `chunk_rows x V` logits.
#[allow(clippy::too_many_arguments)]
pub fn chunked_lm_head(
    stream: &Stream,
    h: &BufferView<'_, f32>,
    w: &BufferView<'_, f32>,
    labels: &[i32],
    d_model: usize,
    vocab: usize,
    chunk_rows: usize,
    norm: LossNorm,
    mut grads: LmHeadGrads<'_>,
) -> Result<CeStats> {
    let op = "cross_entropy_chunked";
    let devices = present(&[h.device(), w.device()], &grads.devices());
    let backend = backend(op, stream, &devices)?;
    // The producer slices h and dh by rows: check every length before any call.
    check_len(op, "h", h.len(), labels.len() * d_model)?;
    check_len(op, "w", w.len(), vocab * d_model)?;
    if let Some(dh) = &grads.dh {
        check_len(op, "dh", dh.len(), h.len())?;
    }
    if let Some(dw) = &grads.dw {
        check_len(op, "dw", dw.len(), w.len())?;
    }
    match backend {
        Backend::Cpu => {
            let with_grad = grads.dh.is_some() || grads.dw.is_some();
            let mut producer = LmHeadCpu {
                h: h.as_host_slice()?,
                w: w.as_host_slice()?,
                dh: grads
                    .dh
                    .as_mut()
                    .map(|v| v.as_host_slice_mut())
                    .transpose()?,
                dw: grads
                    .dw
                    .as_mut()
                    .map(|v| v.as_host_slice_mut())
                    .transpose()?,
                d_model,
                vocab,
            };
            cross_entropy_chunked(&mut producer, labels, vocab, chunk_rows, norm, with_grad)
        }
        Backend::Npu(ordinal) => npu::chunked_lm_head(
            ordinal, stream, h, w, labels, d_model, vocab, chunk_rows, norm, grads,
        ),
    }
}

/// The lm_head logits of a block of rows on the CPU, through `linear`.
struct LmHeadCpu<'a> {
    h: &'a [f32],
    w: &'a [f32],
    dh: Option<&'a mut [f32]>,
    dw: Option<&'a mut [f32]>,
    d_model: usize,
    vocab: usize,
}

impl LmHeadCpu<'_> {
    fn dims(&self, rows: &Range<usize>) -> LinearDims {
        LinearDims {
            t: rows.len(),
            d_in: self.d_model,
            d_out: self.vocab,
        }
    }

    /// Elements `rows x D` of an `[N, D]` buffer.
    fn span(&self, rows: &Range<usize>) -> Range<usize> {
        rows.start * self.d_model..rows.end * self.d_model
    }
}

fn rows_error(rows: &Range<usize>) -> KernelError {
    KernelError::Shape {
        op: "cross_entropy_chunked",
        detail: format!("rows {rows:?} outside h"),
    }
}

impl ChunkedLogits for LmHeadCpu<'_> {
    type Error = KernelError;

    fn logits(&mut self, rows: Range<usize>, out: &mut [f32]) -> Result<()> {
        let h = self
            .h
            .get(self.span(&rows))
            .ok_or_else(|| rows_error(&rows))?;
        linear_forward(out, h, self.w, None, self.dims(&rows))
    }

    fn backward(&mut self, rows: Range<usize>, d_logits: &[f32]) -> Result<()> {
        let (span, d) = (self.span(&rows), self.dims(&rows));
        let h = self.h.get(span.clone()).ok_or_else(|| rows_error(&rows))?;
        let dx = match self.dh.as_deref_mut() {
            Some(dh) => Some(dh.get_mut(span).ok_or_else(|| rows_error(&rows))?),
            None => None,
        };
        let grads = LinearGrads {
            dx,
            dw: self.dw.as_deref_mut(),
            db: None,
        };
        linear_backward(grads, d_logits, h, self.w, d)
    }
}
