//! Cross-entropy of the lm_head logits `h w^T`, made a block of rows at a time: the gradient
//! views a device-level call accumulates into, and the CPU producer of the logits through
//! `linear`.
//!
//! ```text
//! h: [N, D] f32   w: [V, D] f32   dh: [N, D] f32   dw: [V, D] f32   labels: [N] i32 (host)
//! ```

use super::ChunkedLogits;
use crate::error::{check_len, KernelError, Result};
use crate::gemm::Precision;
use crate::linear::{host::linear_backward, host::linear_forward, LinearDims, LinearGrads};
use cannon_runtime::{BufferViewMut, Device};
use std::ops::Range;

/// The gradients of the lm_head form ([`crate::ops::cross_entropy_lm_head`]); `None` skips
/// one. Both accumulate.
pub struct LmHeadGrads<'a> {
    /// `[N, D]`
    pub dh: Option<BufferViewMut<'a, f32>>,
    /// `[V, D]`
    pub dw: Option<BufferViewMut<'a, f32>>,
}

impl crate::backend::OnDevice for LmHeadGrads<'_> {
    fn devices(&self, out: &mut Vec<Device>) {
        self.dh.devices(out);
        self.dw.devices(out);
    }
}

impl LmHeadGrads<'_> {
    /// Checks every length before any block runs (the producer slices h and dh by rows).
    pub(crate) fn check(
        &self,
        h: usize,
        w: usize,
        rows: usize,
        d_model: usize,
        vocab: usize,
    ) -> Result<()> {
        let op = "cross_entropy_chunked";
        check_len(op, "h", h, rows * d_model)?;
        check_len(op, "w", w, vocab * d_model)?;
        if let Some(dh) = &self.dh {
            check_len(op, "dh", dh.len(), h)?;
        }
        if let Some(dw) = &self.dw {
            check_len(op, "dw", dw.len(), w)?;
        }
        Ok(())
    }
}

/// The lm_head logits of a block of rows on the CPU, through `linear` (f32).
pub(crate) struct LmHeadCpu<'a> {
    pub h: &'a [f32],
    pub w: &'a [f32],
    pub dh: Option<&'a mut [f32]>,
    pub dw: Option<&'a mut [f32]>,
    pub d_model: usize,
    pub vocab: usize,
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
        linear_forward(Precision::F32, out, h, self.w, None, self.dims(&rows))
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
        linear_backward(Precision::F32, grads, d_logits, h, self.w, d)
    }
}
