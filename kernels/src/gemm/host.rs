//! The slice-level API of [`super`] on host memory: the CPU kernels themselves, each
//! checking the op's rules and running the code of `cpu.rs`. [`crate::ops`] runs these on
//! the buffers' host slices when the stream is on the CPU.

use super::*;

/// `C = alpha * op(A) op(B) + beta * C` in precision `p`: the entry point generic over the
/// operands' storage. `F32` runs [`gemm_f32`] and needs f32 operands (a bf16 operand is a
/// typed error, not a silent widening); `Bf16` runs [`gemm_bf16`] on bf16 or f32 operands.
#[allow(clippy::too_many_arguments)]
pub fn gemm<A: Float, B: Float>(
    p: Precision,
    ta: Trans,
    tb: Trans,
    d: Dims,
    alpha: f32,
    a: &[A],
    lda: usize,
    b: &[B],
    ldb: usize,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
) -> Result<()> {
    check_gemm::<A, B>(
        p,
        (ta, tb),
        d,
        (a.len(), lda),
        (b.len(), ldb),
        (c.len(), ldc),
    )?;
    match p {
        Precision::F32 => {
            let a = crate::cast::as_f32(a).ok_or_else(|| not_f32("gemm", "a"))?;
            let b = crate::cast::as_f32(b).ok_or_else(|| not_f32("gemm", "b"))?;
            gemm_f32(ta, tb, d, alpha, a, lda, b, ldb, beta, c, ldc)
        }
        Precision::Bf16 => gemm_bf16(ta, tb, d, alpha, a, lda, b, ldb, beta, c, ldc),
    }
}

/// `C = alpha * op(A) op(B) + beta * C` in f32 (see the module docs for the layout rules).
#[allow(clippy::too_many_arguments)]
pub fn gemm_f32(
    ta: Trans,
    tb: Trans,
    d: Dims,
    alpha: f32,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
) -> Result<()> {
    check_operands(
        "gemm_f32",
        ta,
        tb,
        d,
        a.len(),
        lda,
        b.len(),
        ldb,
        c.len(),
        ldc,
    )?;
    cpu::gemm_f32(ta, tb, d, alpha, a, lda, b, ldb, beta, c, ldc);
    Ok(())
}

/// `C = alpha * op(A) op(B) + beta * C` with bf16 inputs and f32 accumulation and output.
///
/// Uses the AVX512-BF16 kernel when the CPU has it, else [`gemm_bf16_portable`].
#[allow(clippy::too_many_arguments)]
pub fn gemm_bf16<TA: Float, TB: Float>(
    ta: Trans,
    tb: Trans,
    d: Dims,
    alpha: f32,
    a: &[TA],
    lda: usize,
    b: &[TB],
    ldb: usize,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
) -> Result<()> {
    let ops = (a, lda, b, ldb, c, ldc);
    checked_bf16(ta, tb, d, alpha, beta, ops, false)
}

/// [`gemm_bf16`] without the AVX512-BF16 kernel: the bf16-rounded inputs are widened to f32
/// and multiplied by [`gemm_f32`]. This is the fallback on other CPUs; it is public so tests
/// and benchmarks can compare the two paths.
#[allow(clippy::too_many_arguments)]
pub fn gemm_bf16_portable<TA: Float, TB: Float>(
    ta: Trans,
    tb: Trans,
    d: Dims,
    alpha: f32,
    a: &[TA],
    lda: usize,
    b: &[TB],
    ldb: usize,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
) -> Result<()> {
    let ops = (a, lda, b, ldb, c, ldc);
    checked_bf16(ta, tb, d, alpha, beta, ops, true)
}
