//! GEMM on runtime buffers: the device-level entry points
//! (re-exported by [`crate::ops`]).
//!
//! Each runs the op's check (the rule its slice-level function and NPU body apply too, so
//! the meta device rejects what the CPU would), selects the backend once (every operand on
//! the stream's device, [`backend::select`]), and matches on it: the CPU arm
//! ([`on_cpu`]) borrows the buffers' host slices for [`super::host`], the NPU arm is the
//! op's aclnn body (`npu.rs`), the meta arm computes nothing.

use super::npu;
use super::{Dims, Precision, Trans};
use crate::backend::{self, Npu, Selected};
use crate::error::Result;
use cannon_runtime::trace;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// [`crate::gemm::host::gemm_f32`] on `stream`'s device:
/// `C = alpha op(A) op(B) + beta C` in precision `p` ([`crate::gemm`]).
#[allow(clippy::too_many_arguments)]
pub fn gemm<A: Float, B: Float>(
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
    let (al, bl, cl) = ((a.len(), lda), (b.len(), ldb), (c.len(), ldc));
    super::check_gemm::<A, B>(p, (ta, tb), d, al, bl, cl)?;
    let _span = trace::span_on(stream, "gemm", trace::Cat::Gemm);
    match backend::select("gemm", stream, &[&a, &b, &c])? {
        Selected::Cpu(_) => on_cpu::gemm(p, ta, tb, d, alpha, a, lda, b, ldb, beta, c, ldc),
        Selected::Npu(Npu { ordinal }) => npu::gemm(
            ordinal, stream, p, ta, tb, d, alpha, a, lda, b, ldb, beta, c, ldc,
        ),
        Selected::Meta(_) => Ok(()),
    }
}

/// The CPU arm of each entry point: the buffers' host slices passed to the slice-level
/// function, without the entry's check or device selection (the slice-level function checks
/// by itself; tests compare the two).
pub mod on_cpu {
    use super::*;
    use crate::gemm::host;

    #[allow(clippy::too_many_arguments)]
    pub fn gemm<A: Float, B: Float>(
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
        let (a, b, c) = (
            a.as_host_slice()?,
            b.as_host_slice()?,
            c.as_host_slice_mut()?,
        );
        host::gemm(p, ta, tb, d, alpha, a, lda, b, ldb, beta, c, ldc)
    }
}
