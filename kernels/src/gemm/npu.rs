//! GEMM's NPU entry points (bodies land with the NPU issue; until then they return
//! [`npu_pending`]: `NotCompiled` without `--features npu`, `Unsupported` with it).
//!
//! aclnnMatmul takes strided views, so `Trans::T` and the row strides `ld*` become the
//! operands' aclTensor strides (no transposing copy). It has no alpha/beta: with
//! `alpha = 1, beta = 0` it writes C directly; otherwise it writes a `[m, n]` f32 scratch P
//! and the body finishes with `aclnnInplaceMuls(C, beta)` (skipped for beta = 1) and
//! `aclnnInplaceAdd(C, P, alpha)`, which is how the backward passes accumulate.

use super::{Dims, Precision, Trans};
use crate::backend::npu_pending;
use crate::error::Result;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// `aclnnMatmul(self = op(A), mat2 = op(B), out)` plus the alpha/beta epilogue.
///
/// `F32`: `cubeMathType = 0 KEEP_DTYPE`, not HF32, so the products stay f32 as on the CPU
/// (some parts reject f32 with KEEP_DTYPE, which the body reports as `Unsupported`). `Bf16`:
/// bf16 operands (an f32 operand is rounded first with `aclnnCast`, the CPU's ties-to-even
/// rounding) accumulating in f32 into f32 C; whether a part writes f32 out of bf16 operands
/// directly is to be confirmed on hardware; a bf16 result would not match the CPU's f32
/// output and is not an acceptable substitute.
#[allow(clippy::too_many_arguments)]
pub fn gemm<A: Float, B: Float>(
    ordinal: u32,
    _stream: &Stream,
    p: Precision,
    _ta: Trans,
    _tb: Trans,
    _d: Dims,
    _alpha: f32,
    _a: &BufferView<'_, A>,
    _lda: usize,
    _b: &BufferView<'_, B>,
    _ldb: usize,
    _beta: f32,
    _c: &mut BufferViewMut<'_, f32>,
    _ldc: usize,
) -> Result<()> {
    Err(match p {
        Precision::F32 => npu_pending("gemm", ordinal, "aclnnMatmul"),
        Precision::Bf16 => {
            npu_pending("gemm", ordinal, "aclnnMatmul (+ aclnnCast of f32 operands)")
        }
    })
}
