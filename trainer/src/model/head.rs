//! The lm_head and the loss, full or chunked.
//!
//! ```text
//! logits[T,V] = xf[T,D] lm_head[V,D]^T
//! loss        = mean over targets != IGNORE_INDEX of  lse(logits[t]) - logits[t, target[t]]
//! ```
//!
//! Full ([`LossMode::Full`]): the forward materialises the logits and writes d loss / d logits
//! with the loss (`cannon_kernels::cross_entropy`); the backward is the lm_head's linear
//! backward. Chunked ([`LossMode::Chunked`]): no `[T,V]` buffer ever exists. The forward runs
//! `cross_entropy_chunked` without gradient over `rows` at a time (the lm_head GEMM per chunk);
//! the backward runs it again with the gradient and hands each chunk's d logits straight to
//! the lm_head backward (`dxf[rows] += dl W`, `dW += dl^T xf[rows]`): one more lm_head GEMM
//! for at most `rows x V` floats instead of `T x V`.

use super::ops::{dims, Act};
use cannon_kernels::cross_entropy::{self, ChunkedLogits, LossNorm};
use cannon_kernels::linear::LinearGrads;
use cannon_kernels::KernelError;
use std::ops::Range;

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
#[derive(Clone, Debug)]
pub struct HeadActs {
    /// `[T,V]` logits (full mode only).
    pub logits: Option<Vec<f32>>,
    /// `[T,V]` d loss / d logits (full mode only).
    pub dlogits: Option<Vec<f32>>,
    /// Mean loss over the targets.
    pub loss: f64,
    /// Targets that count in the mean.
    pub targets: usize,
}

/// The lm_head as a [`ChunkedLogits`] producer over `xf [T,D]`.
struct LmHead<'a, A> {
    xf: &'a [A],
    w: &'a [f32],
    d: usize,
    v: usize,
    dxf: Option<&'a mut [f32]>,
    dw: Option<&'a mut [f32]>,
}

impl<A: Act> ChunkedLogits for LmHead<'_, A> {
    type Error = KernelError;

    fn logits(&mut self, rows: Range<usize>, out: &mut [f32]) -> Result<(), KernelError> {
        let x = &self.xf[rows.start * self.d..rows.end * self.d];
        A::linear(out, x, self.w, dims(x.len(), self.d, self.v))
    }

    fn backward(&mut self, rows: Range<usize>, dl: &[f32]) -> Result<(), KernelError> {
        let x = &self.xf[rows.start * self.d..rows.end * self.d];
        let g = LinearGrads {
            dx: self
                .dxf
                .as_deref_mut()
                .map(|dx| &mut dx[rows.start * self.d..rows.end * self.d]),
            dw: self.dw.as_deref_mut(),
            db: None,
        };
        A::linear_back(g, dl, x, self.w, dims(x.len(), self.d, self.v))
    }
}

/// Logits and loss of `xf [T,D]` against `targets [T]` (`IGNORE_INDEX` = ignored).
pub fn forward<A: Act>(
    mode: LossMode,
    xf: &[A],
    w: &[f32],
    targets: &[i32],
    d: usize,
    v: usize,
) -> Result<HeadActs, KernelError> {
    match mode {
        LossMode::Full => {
            let mut logits = vec![0.0; targets.len() * v];
            A::linear(&mut logits, xf, w, dims(xf.len(), d, v))?;
            let mut dlogits = vec![0.0; logits.len()];
            let st = cross_entropy::cross_entropy(
                &logits,
                targets,
                v,
                Some(&mut dlogits),
                LossNorm::Mean,
            )?;
            Ok(HeadActs {
                logits: Some(logits),
                dlogits: Some(dlogits),
                loss: st.loss,
                targets: st.count,
            })
        }
        LossMode::Chunked(rows) => {
            let mut head = LmHead {
                xf,
                w,
                d,
                v,
                dxf: None,
                dw: None,
            };
            let st = cross_entropy::cross_entropy_chunked(
                &mut head,
                targets,
                v,
                rows,
                LossNorm::Mean,
                false,
            )?;
            Ok(HeadActs {
                logits: None,
                dlogits: None,
                loss: st.loss,
                targets: st.count,
            })
        }
    }
}

/// Backward of the loss through the lm_head: `dxf [T,D] += d loss / d xf` and, if given,
/// `dw [V,D] += d loss / d lm_head`.
#[allow(clippy::too_many_arguments)]
pub fn backward<A: Act>(
    mode: LossMode,
    h: &HeadActs,
    xf: &[A],
    w: &[f32],
    targets: &[i32],
    d: usize,
    v: usize,
    dxf: &mut [f32],
    dw: Option<&mut [f32]>,
) -> Result<(), KernelError> {
    match (mode, &h.dlogits) {
        (LossMode::Full, Some(dl)) => {
            let g = LinearGrads {
                dx: Some(dxf),
                dw,
                db: None,
            };
            A::linear_back(g, dl, xf, w, dims(xf.len(), d, v))
        }
        (LossMode::Chunked(rows), _) => {
            let mut head = LmHead {
                xf,
                w,
                d,
                v,
                dxf: Some(dxf),
                dw,
            };
            cross_entropy::cross_entropy_chunked(
                &mut head,
                targets,
                v,
                rows,
                LossNorm::Mean,
                true,
            )?;
            Ok(())
        }
        (LossMode::Full, None) => Err(KernelError::InvalidArgument {
            op: "head::backward",
            detail: "full-loss activations without d logits".into(),
        }),
    }
}
