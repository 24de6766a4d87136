//! Cross-entropy on runtime buffers: the device-level entry points
//! (re-exported by [`crate::ops`]).
//!
//! Each runs the op's check (the rule its slice-level function and NPU body apply too, so
//! the meta device rejects what the CPU would), selects the backend once (every operand on
//! the stream's device, [`backend::select`]), and matches on it: the CPU arm
//! ([`on_cpu`]) borrows the buffers' host slices for [`super::host`], the NPU arm is the
//! op's aclnn body (`npu.rs`), the meta arm computes nothing.

use super::npu;
use super::{CeStats, LmHeadCpu, LmHeadGrads, LossNorm};
use crate::backend::{self, Npu, Selected};
use crate::error::Result;
use cannon_runtime::trace;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// [`crate::cross_entropy::host::cross_entropy`] on `stream`'s device:
/// Cross-entropy of `[N, V]` logits; writes `d_logits` when given.
pub fn cross_entropy(
    stream: &Stream,
    logits: &BufferView<'_, f32>,
    labels: &[i32],
    vocab: usize,
    d_logits: Option<&mut BufferViewMut<'_, f32>>,
    norm: LossNorm,
) -> Result<CeStats> {
    let (n, d) = (logits.len(), d_logits.as_ref().map(|d| d.len()));
    super::check_full("cross_entropy", labels, vocab, n, d, norm)?;
    let _span = trace::span_on(stream, "cross_entropy", trace::Cat::Loss);
    match backend::select("cross_entropy", stream, &[&logits, &d_logits])? {
        Selected::Cpu(_) => on_cpu::cross_entropy(logits, labels, vocab, d_logits, norm),
        Selected::Npu(Npu { ordinal }) => {
            npu::full(ordinal, stream, logits, labels, vocab, d_logits, norm)
        }
        Selected::Meta(_) => Ok(CeStats::of_labels(labels)),
    }
}

/// [`crate::cross_entropy::host::cross_entropy_in_place`] on `stream`'s device:
/// Cross-entropy whose gradient overwrites the logits.
pub fn cross_entropy_in_place(
    stream: &Stream,
    logits: &mut BufferViewMut<'_, f32>,
    labels: &[i32],
    vocab: usize,
    norm: LossNorm,
) -> Result<CeStats> {
    let (op, n) = ("cross_entropy_in_place", logits.len());
    super::check_full(op, labels, vocab, n, None, norm)?;
    let _span = trace::span_on(stream, "cross_entropy_in_place", trace::Cat::Loss);
    match backend::select("cross_entropy_in_place", stream, &[&logits])? {
        Selected::Cpu(_) => on_cpu::cross_entropy_in_place(logits, labels, vocab, norm),
        Selected::Npu(Npu { ordinal }) => {
            npu::in_place(ordinal, stream, logits, labels, vocab, norm)
        }
        Selected::Meta(_) => Ok(CeStats::of_labels(labels)),
    }
}

/// [`crate::cross_entropy::host::cross_entropy_chunked`] on `stream`'s device:
/// Cross-entropy of the lm_head logits `h w^T`, `chunk_rows` rows at a time.
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
    super::check_chunked(labels, vocab, chunk_rows, norm)?;
    let _span = trace::span_on(stream, "cross_entropy_lm_head", trace::Cat::Loss);
    match backend::select("cross_entropy_lm_head", stream, &[&h, &w, &grads])? {
        Selected::Cpu(_) => {
            on_cpu::cross_entropy_lm_head(h, w, labels, d_model, vocab, chunk_rows, norm, grads)
        }
        Selected::Npu(Npu { ordinal }) => npu::chunked_lm_head(
            ordinal, stream, h, w, labels, d_model, vocab, chunk_rows, norm, grads,
        ),
        Selected::Meta(_) => Ok(CeStats::of_labels(labels)),
    }
}

/// The CPU arm of each entry point: the buffers' host slices passed to the slice-level
/// function, without the entry's check or device selection (the slice-level function checks
/// by itself; tests compare the two).
pub mod on_cpu {
    use super::*;
    use crate::cross_entropy::host;

    pub fn cross_entropy(
        logits: &BufferView<'_, f32>,
        labels: &[i32],
        vocab: usize,
        d_logits: Option<&mut BufferViewMut<'_, f32>>,
        norm: LossNorm,
    ) -> Result<CeStats> {
        let d_logits = d_logits.map(|d| d.as_host_slice_mut()).transpose()?;
        host::cross_entropy(logits.as_host_slice()?, labels, vocab, d_logits, norm)
    }

    pub fn cross_entropy_in_place(
        logits: &mut BufferViewMut<'_, f32>,
        labels: &[i32],
        vocab: usize,
        norm: LossNorm,
    ) -> Result<CeStats> {
        host::cross_entropy_in_place(logits.as_host_slice_mut()?, labels, vocab, norm)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn cross_entropy_lm_head(
        h: &BufferView<'_, f32>,
        w: &BufferView<'_, f32>,
        labels: &[i32],
        d_model: usize,
        vocab: usize,
        chunk_rows: usize,
        norm: LossNorm,
        mut grads: LmHeadGrads<'_>,
    ) -> Result<CeStats> {
        // The lm_head's lengths, as the NPU body checks them (the slice-level loss sees only
        // the producer, which slices h and dh by rows).
        grads.check(h.len(), w.len(), labels.len(), d_model, vocab)?;
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
        host::cross_entropy_chunked(&mut producer, labels, vocab, chunk_rows, norm, with_grad)
    }
}
