//! Clipping's NPU bodies. aclnn has no global-norm op among our bindings, so clipping is a
//! documented composition of a sum of squares per view and a scaling by a host scalar; the
//! norm, the coefficient and the cross-rank all-reduce of the sum stay on the host exactly as
//! in the CPU path.
//!
//! Sum of squares: each view is cut into rows of [`ROW`] elements (plus a shorter tail row),
//! and one batched `aclnnMatmul` of the rows viewed `[R, 1, ROW]` by the same memory viewed
//! `[R, ROW, 1]` gives the R row dot products `g_r . g_r` (f32 accumulation over at most
//! ROW elements each), copied to the host and summed in f64 in order. The CPU sums in f64
//! throughout; the f32 partial sums add a relative error of about ROW * 2^-24 / sqrt(ROW)
//! per row, far below what a clipping coefficient needs.
#![cfg_attr(
    not(feature = "npu"),
    allow(unused_variables, unused_imports, dead_code)
)]

use crate::backend::npu_body;
use crate::error::Result;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// Elements per partial sum.
const ROW: usize = 4096;

/// The f32 dot products of `n` rows of `c` elements at `ptr` with themselves, on the host.
#[cfg(feature = "npu")]
fn row_dots(
    op: &'static str,
    stream: &Stream,
    ptr: *mut std::ffi::c_void,
    r: usize,
    c: usize,
) -> Result<Vec<f32>> {
    use crate::backend::aclnn::{aclnn, AclTensor};
    use cannon_runtime::DeviceBuffer;
    let (r64, c64) = (r as i64, c as i64);
    let storage = [r64 * c64];
    // SAFETY: `ptr` holds r * c f32 values of the caller's gradient view.
    let a =
        unsafe { AclTensor::strided::<f32>(op, ptr, &[r64, 1, c64], &[c64, c64, 1], &storage) }?;
    // SAFETY: `ptr` holds r * c f32 values of the caller's gradient view.
    let b = unsafe { AclTensor::strided::<f32>(op, ptr, &[r64, c64, 1], &[c64, 1, 1], &storage) }?;
    let mut out = DeviceBuffer::<f32>::alloc(stream, r)?;
    {
        let o = AclTensor::from_buffer(op, &mut out, &[r, 1, 1])?;
        aclnn!(
            op,
            stream,
            aclnnMatmulGetWorkspaceSize,
            aclnnMatmul,
            (a.raw(), b.raw(), o.raw(), 0i8)
        )?;
    }
    Ok(out.clone_dtoh(stream)?)
}

/// `sum_v sum_i g_v[i]^2` in f64 over every view (see the module docs).
pub fn grad_sum_squares(
    ordinal: u32,
    stream: &Stream,
    grads: &[BufferView<'_, f32>],
) -> Result<f64> {
    const OP: &str = "grad_sum_squares";
    npu_body!(OP, ordinal, "aclnnMatmul (batched row dot products)", {
        let mut sum = 0.0f64;
        for g in grads {
            let full = g.len() / ROW;
            let tail = g.len() - full * ROW;
            let base = g.as_raw_ptr() as *mut std::ffi::c_void;
            if full > 0 {
                sum = row_dots(OP, stream, base, full, ROW)?
                    .iter()
                    .fold(sum, |s, &x| s + x as f64);
            }
            if tail > 0 {
                // The tail starts ROW * full floats in: 32-byte aligned when the view is.
                let t = g.slice(full * ROW..g.len())?;
                sum = row_dots(OP, stream, t.as_raw_ptr() as *mut _, 1, tail)?
                    .iter()
                    .fold(sum, |s, &x| s + x as f64);
            }
        }
        Ok(sum)
    })
}

/// `aclnnInplaceMuls(g, coef)` on every view.
pub fn scale_grads(
    ordinal: u32,
    stream: &Stream,
    grads: &mut [BufferViewMut<'_, f32>],
    coef: f32,
) -> Result<()> {
    const OP: &str = "scale_grads";
    npu_body!(OP, ordinal, "aclnnInplaceMuls", {
        use crate::backend::aclnn::{aclnn, AclScalar, AclTensor};
        let c = AclScalar::f32(OP, coef)?;
        for g in grads.iter_mut() {
            if g.is_empty() {
                continue;
            }
            let n = [g.len()];
            let t = AclTensor::from_view_mut(OP, g, &n)?;
            aclnn!(
                OP,
                stream,
                aclnnInplaceMulsGetWorkspaceSize,
                aclnnInplaceMuls,
                (t.raw(), c.raw())
            )?;
        }
        Ok(())
    })
}
