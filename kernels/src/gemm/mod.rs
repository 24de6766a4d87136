//! gemm: the CPU matrix multiply every other op is built on.
//!
//! ```text
//! C[m,n] = alpha * op(A)[m,k] @ op(B)[k,n] + beta * C[m,n]
//! ```
//!
//! All matrices are row-major with an explicit row stride (`ld*`, in elements), so a caller can
//! multiply windows of bigger buffers. `op(X)` is `X` ([`Trans::N`]) or `X^T` ([`Trans::T`]):
//!
//! | flag | stored as | element `op(A)[i][p]` | `lda` at least |
//! |------|-----------|-----------------------|----------------|
//! | `N`  | `[m, k]`  | `a[i * lda + p]`      | `k`            |
//! | `T`  | `[k, m]`  | `a[p * lda + i]`      | `m`            |
//!
//! (and likewise for B with `[k, n]` / `[n, k]`). The three products of a linear layer need no
//! explicit transposes:
//!
//! ```text
//! forward   Y[T,out]  = X[T,in] W[out,in]^T      gemm(N, T, ...)
//! backward  dX[T,in] += dY[T,out] W[out,in]      gemm(N, N, ..., beta = 1)
//!           dW[out,in] += dY[T,out]^T X[T,in]    gemm(T, N, ..., beta = 1)
//! ```
//!
//! `beta == 0` means C is write-only (its old contents, even NaN, are ignored), as in BLAS.
//! Slices must hold at least `(rows - 1) * ld + cols` elements (empty matrices need none);
//! anything shorter, or a row stride smaller than the row, is a [`KernelError::Shape`].
//!
//! Two element types:
//! - [`gemm_f32`](host::gemm_f32): f32 in, f32 out, on faer's `gemm` crate (AVX-512 microkernels, packing),
//!   except `op(A) = A^T` with m >= 4096 on AVX-512 (a wide layer's weight gradient), which
//!   runs our own packed kernel (x86_f32.rs: faer's packing of that layout is memory-bound).
//! - [`gemm_bf16`](host::gemm_bf16): inputs rounded to bf16 (stored as `half::bf16`, or f32 rounded to nearest
//!   even while packing), products accumulated in f32, f32 out. On CPUs with AVX512-BF16 it runs
//!   our own packed `vdpbf16ps` kernel; elsewhere (or through [`gemm_bf16_portable`](host::gemm_bf16_portable)) it widens
//!   the rounded inputs to f32 and calls [`gemm_f32`](host::gemm_f32), which gives the same result up to f32
//!   summation order.
//!
//! All entry points use rayon's global pool (the threads every CPU kernel shares); products
//! under 64^3 multiply-adds stay on the calling thread. Calls from inside rayon tasks are fine
//! (packing buffers are per thread and never held across a rayon call).
//!
//! bf16 numerics: `vdpbf16ps` treats bf16 denormals (|x| < 1.2e-38) as zero, and f32 inputs
//! are rounded with `vcvtne2ps2bf16`, which flushes f32 denormals likewise; the portable path
//! keeps them. Nothing else differs between the two paths beyond f32 summation order.
//!
//! Speed: the measured rates are in docs/benchmarks.md ("Kernel rates").

mod cpu;
pub mod device;
pub mod host;
pub(crate) mod npu;
// AVX-512 intrinsics are stable since 1.89, above the workspace rust-version.
#[cfg(target_arch = "x86_64")]
#[clippy::msrv = "1.89"]
mod x86_bf16;
#[cfg(target_arch = "x86_64")]
#[clippy::msrv = "1.89"]
mod x86_f32;
#[cfg(target_arch = "x86_64")]
#[clippy::msrv = "1.89"]
mod x86_pack;
#[cfg(target_arch = "x86_64")]
#[clippy::msrv = "1.89"]
mod x86_tile;

#[cfg(test)]
mod tests;

use crate::error::{KernelError, Result};
use cannon_runtime::Float;

pub use cpu::{bf16_kernel_available, to_bf16_bits};

/// Whether a matrix operand is used as stored (`N`) or transposed (`T`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trans {
    N,
    T,
}

/// The precision of a layer's products, the one `Precision` of the workspace: the trainer's
/// run precision (f32, or bf16 autocast) picks it, and `linear` / `patch_embed` take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    /// f32 operands, f32 products ([`gemm_f32`](host::gemm_f32)).
    F32,
    /// Operands rounded to bf16 (nearest even), f32 accumulation and output ([`gemm_bf16`](host::gemm_bf16)).
    Bf16,
}

impl Precision {
    /// Every precision's [`name`](Precision::name), in declaration order.
    pub const NAMES: [&'static str; 2] = ["f32", "bf16"];

    /// `"f32"` or `"bf16"`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }
}

/// A name that is none of [`Precision::NAMES`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown precision `{0}` (expected f32 or bf16)")]
pub struct UnknownPrecision(pub String);

impl std::str::FromStr for Precision {
    type Err = UnknownPrecision;

    /// The inverse of [`Precision::name`].
    fn from_str(s: &str) -> std::result::Result<Self, UnknownPrecision> {
        match s {
            "f32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            _ => Err(UnknownPrecision(s.to_string())),
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A [`Precision`] as a type, so that layer code (linear, patch embedding) is written once
/// for both and monomorphised: [`F32`] runs [`gemm_f32`](host::gemm_f32), [`Bf16`] runs [`gemm_bf16`](host::gemm_bf16).
/// Both write f32.
pub(crate) trait Products<A, B> {
    /// `C = alpha * op(A) op(B) + beta * C` in this precision.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
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
    ) -> Result<()>;
}

/// f32 products ([`gemm_f32`](host::gemm_f32)).
#[derive(Clone, Copy, Debug)]
pub(crate) struct F32;

/// bf16 products with f32 accumulation ([`gemm_bf16`](host::gemm_bf16)).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bf16;

impl Products<f32, f32> for F32 {
    fn gemm(
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
        host::gemm_f32(ta, tb, d, alpha, a, lda, b, ldb, beta, c, ldc)
    }
}

impl<A: Float, B: Float> Products<A, B> for Bf16 {
    fn gemm(
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
        host::gemm_bf16(ta, tb, d, alpha, a, lda, b, ldb, beta, c, ldc)
    }
}

/// The dimensions of one product: `op(A)` is `[m, k]`, `op(B)` is `[k, n]`, `C` is `[m, n]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// An f32-precision call with a bf16 operand `what`: f32 products need f32 storage (a typed
/// error, not a silent widening). Shared by every op built on the GEMM.
pub(crate) fn not_f32(op: &'static str, what: &str) -> KernelError {
    KernelError::InvalidArgument {
        op,
        detail: format!("{what} is bf16; Precision::F32 needs f32 operands (use Precision::Bf16)"),
    }
}

/// [`not_f32`] for the first bf16 of `operands` (name, storage dtype) under `Precision::F32`:
/// the precision rule of the GEMM-based ops, checked by their entry points (and device
/// bodies) before any backend runs; the host kernels then borrow the slices as f32.
pub(crate) fn require_f32(
    op: &'static str,
    p: Precision,
    operands: &[(&str, cannon_runtime::DType)],
) -> Result<()> {
    match operands
        .iter()
        .find(|(_, d)| *d != cannon_runtime::DType::F32)
    {
        Some((what, _)) if p == Precision::F32 => Err(not_f32(op, what)),
        _ => Ok(()),
    }
}

/// The operands of one product: `(a, lda, b, ldb, c, ldc)`.
type Operands<'a, 'c, TA, TB> = (&'a [TA], usize, &'a [TB], usize, &'c mut [f32], usize);

/// Both bf16 entry points: check the operands, then run the kernel or the portable path.
fn checked_bf16<TA: Float, TB: Float>(
    ta: Trans,
    tb: Trans,
    d: Dims,
    alpha: f32,
    beta: f32,
    (a, lda, b, ldb, c, ldc): Operands<'_, '_, TA, TB>,
    portable: bool,
) -> Result<()> {
    check_operands(
        "gemm_bf16",
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
    cpu::gemm_bf16(ta, tb, d, alpha, a, lda, b, ldb, beta, c, ldc, portable);
    Ok(())
}

/// The rules of [`gemm`](host::gemm) on every backend (the device-level entry point checks them before
/// any backend runs): under `Precision::F32` f32 operands, and each of A, B, C (length,
/// row stride) holding its matrix for `d` and the transposes.
pub(crate) fn check_gemm<A: Float, B: Float>(
    p: Precision,
    (ta, tb): (Trans, Trans),
    d: Dims,
    (a, lda): (usize, usize),
    (b, ldb): (usize, usize),
    (c, ldc): (usize, usize),
) -> Result<()> {
    let op = "gemm";
    require_f32(op, p, &[("a", A::DTYPE), ("b", B::DTYPE)])?;
    check_operands(op, ta, tb, d, a, lda, b, ldb, c, ldc)
}

/// Elements a row-major `[rows, cols]` matrix with row stride `ld` spans.
pub fn strided_len(rows: usize, cols: usize, ld: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * ld + cols
    }
}

fn check_matrix(
    op: &'static str,
    what: &str,
    len: usize,
    rows: usize,
    cols: usize,
    ld: usize,
) -> Result<()> {
    if ld < cols && rows > 1 {
        return Err(KernelError::Shape {
            op,
            detail: format!("{what}: row stride {ld} is smaller than the row length {cols}"),
        });
    }
    let need = strided_len(rows, cols, ld);
    if len < need {
        return Err(KernelError::Shape {
            op,
            detail: format!(
                "{what} has {len} elements, a [{rows}, {cols}] matrix with row stride {ld} \
                 needs {need}"
            ),
        });
    }
    Ok(())
}

/// Checks every operand of `C = op(A) op(B)` against the dims (stored shapes follow the flags).
#[allow(clippy::too_many_arguments)]
fn check_operands(
    op: &'static str,
    ta: Trans,
    tb: Trans,
    d: Dims,
    a_len: usize,
    lda: usize,
    b_len: usize,
    ldb: usize,
    c_len: usize,
    ldc: usize,
) -> Result<()> {
    let (ar, ac) = stored_shape(ta, d.m, d.k);
    let (br, bc) = stored_shape(tb, d.k, d.n);
    check_matrix(op, "A", a_len, ar, ac, lda)?;
    check_matrix(op, "B", b_len, br, bc, ldb)?;
    check_matrix(op, "C", c_len, d.m, d.n, ldc)
}

/// The stored `[rows, cols]` of an operand whose `op(X)` is `[r, c]`.
fn stored_shape(t: Trans, r: usize, c: usize) -> (usize, usize) {
    match t {
        Trans::N => (r, c),
        Trans::T => (c, r),
    }
}
