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

use super::device::Grads;
use super::PatchGeom;
use crate::device::npu_pending;
use crate::error::Result;
use crate::gemm::Bf16Elem;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// `out = aclnnMatmul(im2col view of pixels, W^T view)`, f32.
pub fn forward(
    ordinal: u32,
    _stream: &Stream,
    _out: &mut BufferViewMut<'_, f32>,
    _pixels: &BufferView<'_, f32>,
    _weight: &BufferView<'_, f32>,
    _g: PatchGeom,
    _d_model: usize,
) -> Result<()> {
    Err(npu_pending(
        "patch_embed_forward",
        ordinal,
        "aclnnMatmul on the im2col view",
    ))
}

/// `dW += dOut^T P`, `dpixels += col2im(dOut W)`: aclnnMatmul + aclnnInplaceAdd, f32.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    ordinal: u32,
    _stream: &Stream,
    _grads: Grads<'_>,
    _dout: &BufferView<'_, f32>,
    _pixels: &BufferView<'_, f32>,
    _weight: &BufferView<'_, f32>,
    _g: PatchGeom,
    _d_model: usize,
) -> Result<()> {
    Err(npu_pending(
        "patch_embed_backward",
        ordinal,
        "aclnnMatmul + aclnnInplaceAdd (col2im view)",
    ))
}

/// As [`forward`] on bf16 operands, f32 out.
pub fn forward_bf16<
    P: Bf16Elem + cannon_runtime::Element,
    W: Bf16Elem + cannon_runtime::Element,
>(
    ordinal: u32,
    _stream: &Stream,
    _out: &mut BufferViewMut<'_, f32>,
    _pixels: &BufferView<'_, P>,
    _weight: &BufferView<'_, W>,
    _g: PatchGeom,
    _d_model: usize,
) -> Result<()> {
    Err(npu_pending(
        "patch_embed_forward_bf16",
        ordinal,
        "aclnnMatmul (bf16) on the im2col view",
    ))
}

/// As [`backward`] on bf16 operands, f32 gradients.
#[allow(clippy::too_many_arguments)]
pub fn backward_bf16<
    G: Bf16Elem + cannon_runtime::Element,
    P: Bf16Elem + cannon_runtime::Element,
    W: Bf16Elem + cannon_runtime::Element,
>(
    ordinal: u32,
    _stream: &Stream,
    _grads: Grads<'_>,
    _dout: &BufferView<'_, G>,
    _pixels: &BufferView<'_, P>,
    _weight: &BufferView<'_, W>,
    _g: PatchGeom,
    _d_model: usize,
) -> Result<()> {
    Err(npu_pending(
        "patch_embed_backward_bf16",
        ordinal,
        "aclnnMatmul (bf16) + aclnnInplaceAdd (col2im view)",
    ))
}
