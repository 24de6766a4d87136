//! patch_embed's NPU entry points (bodies land with the NPU issue; until then they return
//! [`npu_pending`]: `NotCompiled` without `--features npu`, `Unsupported` with it).
//!
//! The stride equals the kernel, so im2col is a pure re-indexing: the cropped pixels seen as
//! `[C, gh, p, gw, p]` and permuted to `[gh, gw, C, p, p]` are P `[Np, K]`. The bodies build P
//! as that strided aclTensor view, made contiguous where aclnnMatmul refuses a 5-D permuted
//! view (an aclnnInplaceCopy, not bound yet), and then run the GEMMs of the slice-level module:
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

use super::{PatchEmbedGradBufs, PatchGeom};
use crate::backend::npu_pending;
use crate::error::Result;
use crate::gemm::Precision;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// `out = aclnnMatmul(im2col view of pixels, W^T view)`.
#[allow(clippy::too_many_arguments)]
pub fn forward<P: Float, W: Float>(
    ordinal: u32,
    _stream: &Stream,
    _p: Precision,
    _out: &mut BufferViewMut<'_, f32>,
    _pixels: &BufferView<'_, P>,
    _weight: &BufferView<'_, W>,
    _g: PatchGeom,
    _d_model: usize,
) -> Result<()> {
    Err(npu_pending(
        "patch_embed_forward",
        ordinal,
        "aclnnMatmul over the im2col view (+ aclnnCast under bf16)",
    ))
}

/// `dW += aclnnMatmul(dOut^T, P)`, `dpixels += col2im(aclnnMatmul(dOut, W))`.
#[allow(clippy::too_many_arguments)]
pub fn backward<G: Float, P: Float, W: Float>(
    ordinal: u32,
    _stream: &Stream,
    _p: Precision,
    _grads: PatchEmbedGradBufs<'_>,
    _dout: &BufferView<'_, G>,
    _pixels: &BufferView<'_, P>,
    _weight: &BufferView<'_, W>,
    _g: PatchGeom,
    _d_model: usize,
) -> Result<()> {
    Err(npu_pending(
        "patch_embed_backward",
        ordinal,
        "aclnnMatmul + aclnnInplaceAdd",
    ))
}
