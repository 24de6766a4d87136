//! linear's NPU bodies: the three GEMMs of the slice-level module on `gemm::npu`'s
//! composition (aclnnMatmul with transposes as strides, accumulation by aclnnInplaceAdd):
//!
//! ```text
//! forward   P[T,O]   = aclnnMatmul(X, W^T view)  (f32 scratch)
//!           P       += b (aclnnInplaceAdd, b widened to f32, broadcast over T)
//!           Y        = aclnnCast(P)              (one rounding for bf16 Y; a copy for f32 Y)
//! backward  dX[T,I] += aclnnMatmul(dY, W)
//!           dW[O,I] += aclnnMatmul(dY^T view, X)
//!           db[O]   += aclnnMatmul(ones[1,T], dY)   (the column sum, without a ReduceSum)
//! ```
//!
//! Under `Precision::Bf16` operands are rounded to bf16 first (gemm::npu), products
//! accumulate in f32; the bias is added in f32 and db sums dY's own (unrounded) values in f32,
//! as on the CPU. Under `F32` every operand must be f32, as on the CPU.
#![cfg_attr(
    not(feature = "npu"),
    allow(unused_variables, unused_imports, dead_code)
)]

use super::{LinearDims, LinearGradBufs};
use crate::backend::npu_body;
use crate::error::Result;
use crate::gemm::Precision;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// `Y = X W^T (+ b)`, see the module docs.
#[allow(clippy::too_many_arguments)]
pub fn forward<Y: Float, X: Float, W: Float>(
    ordinal: u32,
    stream: &Stream,
    p: Precision,
    y: &mut BufferViewMut<'_, Y>,
    x: &BufferView<'_, X>,
    w: &BufferView<'_, W>,
    b: Option<&BufferView<'_, W>>,
    d: LinearDims,
) -> Result<()> {
    const OP: &str = "linear_forward";
    npu_body!(
        OP,
        ordinal,
        "aclnnMatmul (+ aclnnCast, aclnnInplaceAdd for the bias)",
        {
            use crate::backend::aclnn::{aclnn, AclScalar, AclTensor};
            use crate::gemm::npu::imp;
            use crate::gemm::{Dims, Trans};
            use cannon_runtime::DeviceBuffer;
            let b_len = b.map(|b| b.len());
            super::check_forward::<Y, X, W>(p, d, y.len(), x.len(), w.len(), b_len)?;
            if y.is_empty() {
                return Ok(());
            }
            let round = p == Precision::Bf16;
            let mut pbuf = DeviceBuffer::<f32>::alloc(stream, d.t * d.d_out)?;
            let dims = Dims {
                m: d.t,
                n: d.d_out,
                k: d.d_in,
            };
            imp::gemm(
                OP,
                stream,
                round,
                Trans::N,
                Trans::T,
                dims,
                1.0,
                x,
                d.d_in,
                w,
                d.d_in,
                0.0,
                &mut pbuf.view_mut(),
                d.d_out,
            )?;
            if let Some(b) = b {
                let b32 = imp::f32_operand(stream, b, d.d_out, false)?;
                let bt = imp::matrix(OP, &b32, Trans::N, 1, d.d_out, d.d_out)?;
                let pt = AclTensor::from_buffer(OP, &mut pbuf, &[d.t, d.d_out])?;
                let one = AclScalar::f32(OP, 1.0)?;
                aclnn!(
                    OP,
                    stream,
                    aclnnInplaceAddGetWorkspaceSize,
                    aclnnInplaceAdd,
                    (pt.raw(), bt.raw(), one.raw())
                )?;
            }
            crate::cast::npu::convert(ordinal, stream, &pbuf.view(), y)
        }
    )
}

/// `dX += dY W`, `dW += dY^T X`, `db += ones^T dY`, see the module docs.
#[allow(clippy::too_many_arguments)]
pub fn backward<G: Float, X: Float, W: Float>(
    ordinal: u32,
    stream: &Stream,
    p: Precision,
    g: LinearGradBufs<'_>,
    dy: &BufferView<'_, G>,
    x: &BufferView<'_, X>,
    w: &BufferView<'_, W>,
    d: LinearDims,
) -> Result<()> {
    const OP: &str = "linear_backward";
    npu_body!(OP, ordinal, "aclnnMatmul + aclnnInplaceAdd", {
        use crate::gemm::npu::imp;
        use crate::gemm::{Dims, Trans};
        use cannon_runtime::DeviceBuffer;
        let mut g = g;
        super::check_backward::<G, X, W>(p, d, g.lens(), dy.len(), x.len(), w.len())?;
        let round = p == Precision::Bf16;
        if let Some(dx) = g.dx.as_mut() {
            let dims = Dims {
                m: d.t,
                n: d.d_in,
                k: d.d_out,
            };
            imp::gemm(
                OP,
                stream,
                round,
                Trans::N,
                Trans::N,
                dims,
                1.0,
                dy,
                d.d_out,
                w,
                d.d_in,
                1.0,
                dx,
                d.d_in,
            )?;
        }
        if let Some(dw) = g.dw.as_mut() {
            let dims = Dims {
                m: d.d_out,
                n: d.d_in,
                k: d.t,
            };
            imp::gemm(
                OP,
                stream,
                round,
                Trans::T,
                Trans::N,
                dims,
                1.0,
                dy,
                d.d_out,
                x,
                d.d_in,
                1.0,
                dw,
                d.d_in,
            )?;
        }
        if let Some(db) = g.db.as_mut() {
            let ones = DeviceBuffer::<f32>::clone_htod(stream, &vec![1.0f32; d.t])?;
            let dims = Dims {
                m: 1,
                n: d.d_out,
                k: d.t,
            };
            imp::gemm(
                OP,
                stream,
                false,
                Trans::N,
                Trans::N,
                dims,
                1.0,
                &ones.view(),
                d.t,
                dy,
                d.d_out,
                1.0,
                db,
                d.d_out,
            )?;
        }
        Ok(())
    })
}
