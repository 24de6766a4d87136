//! patch_embed's NPU bodies.
//!
//! The stride equals the kernel, so im2col is a pure re-indexing: the cropped pixels seen as
//! `[C, gh, p, gw, p]` and permuted to `[gh, gw, C, p, p]` are P `[Np, K]`. The bodies build P
//! as that strided aclTensor view and make it contiguous with aclnnCast to its own dtype (a
//! strided copy; aclnnInplaceCopy is not bound), then run the GEMMs of the slice-level module
//! on gemm::npu's composition:
//!
//! ```text
//! forward   out[Np,D]  = aclnnMatmul(P, W^T view)
//! backward  dW[D,K]   += aclnnMatmul(dOut^T view, P)           (+ aclnnInplaceAdd)
//!           dpixels   += col2im(aclnnMatmul(dOut, W))          (aclnnInplaceAdd into the
//!                        permuted view of dpixels: patches do not overlap, so it is a plain add)
//! ```
//!
//! (aclnnConvolution with stride = kernel over the cropped view is the alternative; it is not
//! bound and its backward writes rather than accumulates.) bf16: f32 operands are rounded with
//! aclnnCast first, products accumulate in f32.

#![cfg_attr(
    not(feature = "npu"),
    allow(unused_variables, unused_imports, dead_code)
)]

use super::{PatchEmbedGradBufs, PatchGeom};
use crate::backend::npu_body;
use crate::error::Result;
use crate::gemm::Precision;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

#[cfg(feature = "npu")]
mod imp {
    use super::*;
    use crate::backend::aclnn::{aclnn, AclTensor};
    use cannon_runtime::{DeviceBuffer, Element};
    use std::ffi::c_void;

    /// The cropped pixels (or their gradient) at `ptr` as the `[gh, gw, C, p, p]` view.
    pub(super) fn patches_view<T: Element>(
        op: &'static str,
        ptr: *mut c_void,
        g: &PatchGeom,
    ) -> Result<AclTensor> {
        let (gh, gw) = g.grid();
        let (c, h, w, p) = (
            g.channels as i64,
            g.height as i64,
            g.width as i64,
            g.patch as i64,
        );
        // SAFETY: `ptr` is a pixels (or dpixels) view of C * H * W values.
        unsafe {
            AclTensor::strided::<T>(
                op,
                ptr,
                &[gh as i64, gw as i64, c, p, p],
                &[p * w, p, h * w, w, 1],
                &[c * h * w],
            )
        }
    }

    /// P `[Np, K]` contiguous, in the pixels' dtype (a strided aclnnCast copy).
    pub(super) fn im2col<T: Float>(
        op: &'static str,
        stream: &Stream,
        pixels: &BufferView<'_, T>,
        g: &PatchGeom,
    ) -> Result<DeviceBuffer<T>> {
        let (gh, gw) = g.grid();
        let mut p = DeviceBuffer::<T>::alloc(stream, g.num_patches() * g.patch_len())?;
        let src = patches_view::<T>(op, pixels.as_raw_ptr() as *mut c_void, g)?;
        let dst = AclTensor::from_buffer(op, &mut p, &[gh, gw, g.channels, g.patch, g.patch])?;
        aclnn!(
            op,
            stream,
            aclnnCastGetWorkspaceSize,
            aclnnCast,
            (src.raw(), T::DTYPE.acl_code(), dst.raw())
        )?;
        Ok(p)
    }
}

/// `out = aclnnMatmul(P, W^T view)` with P the im2col copy of the pixels.
#[allow(clippy::too_many_arguments)]
pub fn forward<P: Float, W: Float>(
    ordinal: u32,
    stream: &Stream,
    p: Precision,
    out: &mut BufferViewMut<'_, f32>,
    pixels: &BufferView<'_, P>,
    weight: &BufferView<'_, W>,
    g: PatchGeom,
    d_model: usize,
) -> Result<()> {
    const OP: &str = "patch_embed_forward";
    npu_body!(OP, ordinal, "aclnnCast (im2col) + aclnnMatmul", {
        use crate::gemm::{npu::imp as gm, Dims, Trans};
        super::check_forward::<P, W>(p, &g, d_model, out.len(), pixels.len(), weight.len())?;
        let (np, k) = (g.num_patches(), g.patch_len());
        if np == 0 || d_model == 0 {
            return Ok(());
        }
        let pm = imp::im2col(OP, stream, pixels, &g)?;
        let dims = Dims {
            m: np,
            n: d_model,
            k,
        };
        gm::gemm(
            OP,
            stream,
            p == Precision::Bf16,
            Trans::N,
            Trans::T,
            dims,
            1.0,
            &pm.view(),
            k,
            weight,
            k,
            0.0,
            out,
            d_model,
        )
    })
}

/// `dW += aclnnMatmul(dOut^T, P)`, `dpixels += col2im(aclnnMatmul(dOut, W))`.
#[allow(clippy::too_many_arguments)]
pub fn backward<G: Float, P: Float, W: Float>(
    ordinal: u32,
    stream: &Stream,
    p: Precision,
    grads: PatchEmbedGradBufs<'_>,
    dout: &BufferView<'_, G>,
    pixels: &BufferView<'_, P>,
    weight: &BufferView<'_, W>,
    g: PatchGeom,
    d_model: usize,
) -> Result<()> {
    const OP: &str = "patch_embed_backward";
    npu_body!(OP, ordinal, "aclnnMatmul + aclnnInplaceAdd", {
        use crate::backend::aclnn::{aclnn, AclScalar, AclTensor};
        use crate::gemm::{npu::imp as gm, Dims, Trans};
        use cannon_runtime::DeviceBuffer;
        let mut grads = grads;
        let (dl, pl, wl) = (dout.len(), pixels.len(), weight.len());
        super::check_backward::<G, P, W>(p, &g, d_model, grads.lens(), dl, pl, wl)?;
        let (np, k) = (g.num_patches(), g.patch_len());
        if np == 0 || d_model == 0 {
            return Ok(());
        }
        let round = p == Precision::Bf16;
        if let Some(dw) = grads.dweight.as_mut() {
            let pm = imp::im2col(OP, stream, pixels, &g)?;
            let dims = Dims {
                m: d_model,
                n: k,
                k: np,
            };
            gm::gemm(
                OP,
                stream,
                round,
                Trans::T,
                Trans::N,
                dims,
                1.0,
                dout,
                d_model,
                &pm.view(),
                k,
                1.0,
                dw,
                k,
            )?;
        }
        if let Some(dp) = grads.dpixels.as_mut() {
            let mut dpm = DeviceBuffer::<f32>::alloc(stream, np * k)?;
            let dims = Dims {
                m: np,
                n: k,
                k: d_model,
            };
            gm::gemm(
                OP,
                stream,
                round,
                Trans::N,
                Trans::N,
                dims,
                1.0,
                dout,
                d_model,
                weight,
                k,
                0.0,
                &mut dpm.view_mut(),
                k,
            )?;
            // col2im: patches do not overlap, so adding P-shaped values into the permuted
            // view of dpixels touches each cropped pixel once.
            let (gh, gw) = g.grid();
            let dst =
                imp::patches_view::<f32>(OP, dp.as_raw_mut_ptr() as *mut std::ffi::c_void, &g)?;
            let src =
                AclTensor::from_buffer(OP, &mut dpm, &[gh, gw, g.channels, g.patch, g.patch])?;
            let one = AclScalar::f32(OP, 1.0)?;
            aclnn!(
                OP,
                stream,
                aclnnInplaceAddGetWorkspaceSize,
                aclnnInplaceAdd,
                (dst.raw(), src.raw(), one.raw())
            )?;
        }
        Ok(())
    })
}
