//! GEMM over runtime buffers: the CPU path is [`gemm_f32`] / [`gemm_bf16`] on the host slices,
//! the NPU path [`super::npu`]. Layout rules (row-major, row strides `ld*`, `Trans` flags) as in
//! the slice-level API:
//!
//! ```text
//! C[m,n] = alpha * op(A)[m,k] @ op(B)[k,n] + beta * C[m,n]
//! ```

use super::{gemm_bf16, gemm_f32, npu, Bf16Elem, Dims, Trans};
use crate::device::{backend, Backend};
use crate::error::Result;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// [`gemm_f32`] on `stream`'s device.
#[allow(clippy::too_many_arguments)]
pub fn f32(
    stream: &Stream,
    ta: Trans,
    tb: Trans,
    d: Dims,
    alpha: f32,
    a: &BufferView<'_, f32>,
    lda: usize,
    b: &BufferView<'_, f32>,
    ldb: usize,
    beta: f32,
    c: &mut BufferViewMut<'_, f32>,
    ldc: usize,
) -> Result<()> {
    match backend("gemm_f32", stream, &[a.device(), b.device(), c.device()])? {
        Backend::Cpu => gemm_f32(
            ta,
            tb,
            d,
            alpha,
            a.as_host_slice()?,
            lda,
            b.as_host_slice()?,
            ldb,
            beta,
            c.as_host_slice_mut()?,
            ldc,
        ),
        Backend::Npu(ordinal) => npu::f32(
            ordinal, stream, ta, tb, d, alpha, a, lda, b, ldb, beta, c, ldc,
        ),
    }
}

/// [`gemm_bf16`] on `stream`'s device: bf16 (or bf16-rounded f32) inputs, f32 C.
#[allow(clippy::too_many_arguments)]
pub fn bf16<TA: Bf16Elem + cannon_runtime::Element, TB: Bf16Elem + cannon_runtime::Element>(
    stream: &Stream,
    ta: Trans,
    tb: Trans,
    d: Dims,
    alpha: f32,
    a: &BufferView<'_, TA>,
    lda: usize,
    b: &BufferView<'_, TB>,
    ldb: usize,
    beta: f32,
    c: &mut BufferViewMut<'_, f32>,
    ldc: usize,
) -> Result<()> {
    match backend("gemm_bf16", stream, &[a.device(), b.device(), c.device()])? {
        Backend::Cpu => gemm_bf16(
            ta,
            tb,
            d,
            alpha,
            a.as_host_slice()?,
            lda,
            b.as_host_slice()?,
            ldb,
            beta,
            c.as_host_slice_mut()?,
            ldc,
        ),
        Backend::Npu(ordinal) => npu::bf16(
            ordinal, stream, ta, tb, d, alpha, a, lda, b, ldb, beta, c, ldc,
        ),
    }
}
