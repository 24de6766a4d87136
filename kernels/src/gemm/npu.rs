//! GEMM's NPU body: `C = alpha op(A) op(B) + beta C` as a composition of aclnn ops
//! (aclnn_matmul.h, aclnn_cast.h, aclnn_mul.h, aclnn_add.h; docs/cann-api.md §4).
//!
//! aclnnMatmul takes strided views, so `Trans::T` and the row strides `ld*` become the
//! operands' aclTensor strides (no transposing copy). It has no alpha/beta: with
//! `alpha = 1, beta = 0` and a contiguous C it writes C directly; otherwise it writes a
//! `[m, n]` f32 scratch P and the body finishes with `aclnnMuls(P, alpha, out = C)` (beta = 0:
//! C's old contents, even NaN, are ignored as in BLAS) or `aclnnInplaceMuls(C, beta)`
//! (skipped for beta = 1) and `aclnnInplaceAdd(C, P, alpha)`, which is how the backward
//! passes accumulate.
//!
//! Precision. Matmul runs on f32 operands with `cubeMathType = 0 KEEP_DTYPE`, not HF32, so
//! the products are f32 as on the CPU. Under `Bf16`, an f32 operand is first rounded to bf16
//! with `aclnnCast` (the CPU's ties-to-even) and widened back, and a bf16 operand is widened
//! with `aclnnCast` (exact): products of bf16 values are exact in f32, so this is the CPU's
//! "bf16 products, f32 accumulation", with an f32 C as the CPU writes, and does not depend
//! on whether a part writes f32 out of bf16 operands (unconfirmed; a bf16 result would not
//! match the CPU's f32 output). The cost is an f32 copy of bf16 operands; a hardware run may
//! replace it with bf16 Matmul into f32 once that is confirmed.
#![cfg_attr(
    not(feature = "npu"),
    allow(unused_variables, unused_imports, dead_code)
)]

use super::{Dims, Precision, Trans};
use crate::backend::npu_body;
use crate::error::Result;
use cannon_runtime::{BufferView, BufferViewMut, Stream};
use cannon_runtime::{DType, Float};

/// `aclnnMatmul(self = op(A), mat2 = op(B), out)` plus the alpha/beta epilogue.
#[allow(clippy::too_many_arguments)]
pub fn gemm<A: Float, B: Float>(
    ordinal: u32,
    stream: &Stream,
    p: Precision,
    ta: Trans,
    tb: Trans,
    d: Dims,
    alpha: f32,
    a: &BufferView<'_, A>,
    lda: usize,
    b: &BufferView<'_, B>,
    ldb: usize,
    beta: f32,
    c: &mut BufferViewMut<'_, f32>,
    ldc: usize,
) -> Result<()> {
    const OP: &str = "gemm";
    npu_body!(
        OP,
        ordinal,
        "aclnnMatmul (+ aclnnCast, aclnnMuls, aclnnInplaceAdd)",
        {
            let (a_len, b_len, c_len) = (a.len(), b.len(), c.len());
            super::check_gemm::<A, B>(p, (ta, tb), d, (a_len, lda), (b_len, ldb), (c_len, ldc))?;
            imp::gemm(
                OP,
                stream,
                p == Precision::Bf16,
                ta,
                tb,
                d,
                alpha,
                a,
                lda,
                b,
                ldb,
                beta,
                c,
                ldc,
            )
        }
    )
}

#[cfg(feature = "npu")]
pub(crate) mod imp {
    use super::*;
    use crate::backend::aclnn::{aclnn, AclScalar, AclTensor};
    use cannon_runtime::DeviceBuffer;
    use std::ffi::c_void;

    /// An f32 operand on the device: the caller's memory, or an f32 copy (widened bf16, or f32
    /// rounded to bf16 when `round`).
    pub(crate) struct F32Operand {
        _owned: Option<DeviceBuffer<f32>>,
        ptr: *mut c_void,
        len: usize,
    }

    /// `x` (stored extent `len`) as f32 values on the device.
    pub(crate) fn f32_operand<T: Float>(
        stream: &Stream,
        x: &BufferView<'_, T>,
        len: usize,
        round: bool,
    ) -> Result<F32Operand> {
        let x = x.slice(0..len)?;
        if T::DTYPE == DType::F32 && !round {
            return Ok(F32Operand {
                _owned: None,
                ptr: x.as_raw_ptr() as *mut c_void,
                len,
            });
        }
        let mut wide = DeviceBuffer::<f32>::alloc(stream, len)?;
        if len > 0 {
            if T::DTYPE == DType::F32 {
                // f32 -> bf16 (nearest even) -> f32: the CPU's rounding of f32 operands.
                let mut narrow = DeviceBuffer::<half::bf16>::alloc(stream, len)?;
                crate::cast::npu::convert(0, stream, &x, &mut narrow.view_mut())?;
                crate::cast::npu::convert(0, stream, &narrow.view(), &mut wide.view_mut())?;
            } else {
                crate::cast::npu::convert(0, stream, &x, &mut wide.view_mut())?;
            }
        }
        let ptr = wide.as_raw_mut_ptr() as *mut c_void;
        Ok(F32Operand {
            _owned: Some(wide),
            ptr,
            len,
        })
    }

    /// The `[r, c]` matrix `op(X)` over a stored operand with row stride `ld`.
    pub(crate) fn matrix(
        op: &'static str,
        x: &F32Operand,
        t: Trans,
        r: usize,
        c: usize,
        ld: usize,
    ) -> Result<AclTensor> {
        let strides = match t {
            Trans::N => [ld as i64, 1],
            Trans::T => [1, ld as i64],
        };
        // SAFETY: a device operand/C view whose stored extent is the storage given.
        unsafe {
            AclTensor::strided::<f32>(
                op,
                x.ptr,
                &[r as i64, c as i64],
                &strides,
                &[x.len.max(1) as i64],
            )
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm<A: Float, B: Float>(
        op: &'static str,
        stream: &Stream,
        round: bool,
        ta: Trans,
        tb: Trans,
        d: Dims,
        alpha: f32,
        a: &BufferView<'_, A>,
        lda: usize,
        b: &BufferView<'_, B>,
        ldb: usize,
        beta: f32,
        c: &mut BufferViewMut<'_, f32>,
        ldc: usize,
    ) -> Result<()> {
        if d.m == 0 || d.n == 0 {
            return Ok(());
        }
        let c_len = super::super::strided_len(d.m, d.n, ldc);
        let c_ptr = c.as_raw_mut_ptr() as *mut c_void;
        let c_t = || {
            // SAFETY: a device operand/C view whose stored extent is the storage given.
            unsafe {
                AclTensor::strided::<f32>(
                    op,
                    c_ptr,
                    &[d.m as i64, d.n as i64],
                    &[ldc as i64, 1],
                    &[c_len as i64],
                )
            }
        };
        let direct = alpha == 1.0 && beta == 0.0 && ldc == d.n && d.k > 0;
        // P = op(A) op(B), into C itself when nothing else is needed.
        let mut scratch = None;
        let p_t = if direct {
            c_t()?
        } else {
            let mut p = if d.k == 0 {
                DeviceBuffer::<f32>::alloc_zeros(stream, d.m * d.n)?
            } else {
                DeviceBuffer::<f32>::alloc(stream, d.m * d.n)?
            };
            let t = AclTensor::from_buffer(op, &mut p, &[d.m, d.n])?;
            scratch = Some(p);
            t
        };
        if d.k > 0 {
            let (ar, ac) = match ta {
                Trans::N => (d.m, d.k),
                Trans::T => (d.k, d.m),
            };
            let (br, bc) = match tb {
                Trans::N => (d.k, d.n),
                Trans::T => (d.n, d.k),
            };
            let a32 = f32_operand(stream, a, super::super::strided_len(ar, ac, lda), round)?;
            let b32 = f32_operand(stream, b, super::super::strided_len(br, bc, ldb), round)?;
            let at = matrix(op, &a32, ta, d.m, d.k, lda)?;
            let bt = matrix(op, &b32, tb, d.k, d.n, ldb)?;
            // cubeMathType 0 = KEEP_DTYPE: f32 products, no HF32.
            aclnn!(
                op,
                stream,
                aclnnMatmulGetWorkspaceSize,
                aclnnMatmul,
                (at.raw(), bt.raw(), p_t.raw(), 0i8)
            )?;
        }
        if direct {
            return Ok(());
        }
        let ct = c_t()?;
        let al = AclScalar::f32(op, alpha)?;
        if beta == 0.0 {
            aclnn!(
                op,
                stream,
                aclnnMulsGetWorkspaceSize,
                aclnnMuls,
                (p_t.raw(), al.raw(), ct.raw())
            )?;
        } else {
            if beta != 1.0 {
                let be = AclScalar::f32(op, beta)?;
                aclnn!(
                    op,
                    stream,
                    aclnnInplaceMulsGetWorkspaceSize,
                    aclnnInplaceMuls,
                    (ct.raw(), be.raw())
                )?;
            }
            aclnn!(
                op,
                stream,
                aclnnInplaceAddGetWorkspaceSize,
                aclnnInplaceAdd,
                (ct.raw(), p_t.raw(), al.raw())
            )?;
        }
        drop(scratch);
        Ok(())
    }
}
