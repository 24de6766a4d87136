//! patch_embed over runtime buffers: the CPU path is the slice-level functions on the host
//! slices, the NPU path [`super::npu`]. Shapes as in the slice-level API:
//!
//! ```text
//! pixels: [C, H, W]   weight: [D, C, p, p]   out, dout: [Np, D]
//! dweight: [D, C, p, p] f32   dpixels: [C, H, W] f32
//! ```

use super::{
    npu, patch_embed_backward, patch_embed_backward_bf16, patch_embed_forward,
    patch_embed_forward_bf16, PatchEmbedGrads, PatchGeom,
};
use crate::device::{backend, present, Backend};
use crate::error::Result;
use crate::gemm::Bf16Elem;
use cannon_runtime::{BufferView, BufferViewMut, Device, Stream};

/// The gradients a device-level backward accumulates into; `None` skips one.
pub struct Grads<'a> {
    /// `[D, C, p, p]`
    pub dweight: Option<BufferViewMut<'a, f32>>,
    /// `[C, H, W]` (only the cropped region is touched)
    pub dpixels: Option<BufferViewMut<'a, f32>>,
}

impl Grads<'_> {
    fn devices(&self) -> [Option<Device>; 2] {
        [
            self.dweight.as_ref().map(|v| v.device()),
            self.dpixels.as_ref().map(|v| v.device()),
        ]
    }

    /// The slice-level gradients over the same (host) memory.
    fn host(&mut self) -> Result<PatchEmbedGrads<'_>> {
        Ok(PatchEmbedGrads {
            dweight: self
                .dweight
                .as_mut()
                .map(|v| v.as_host_slice_mut())
                .transpose()?,
            dpixels: self
                .dpixels
                .as_mut()
                .map(|v| v.as_host_slice_mut())
                .transpose()?,
        })
    }
}

/// [`patch_embed_forward`] on `stream`'s device: `out = im2col(pixels) W^T`, f32.
pub fn forward(
    stream: &Stream,
    out: &mut BufferViewMut<'_, f32>,
    pixels: &BufferView<'_, f32>,
    weight: &BufferView<'_, f32>,
    g: PatchGeom,
    d_model: usize,
) -> Result<()> {
    let devices = [out.device(), pixels.device(), weight.device()];
    match backend("patch_embed_forward", stream, &devices)? {
        Backend::Cpu => patch_embed_forward(
            out.as_host_slice_mut()?,
            pixels.as_host_slice()?,
            weight.as_host_slice()?,
            g,
            d_model,
        ),
        Backend::Npu(ordinal) => npu::forward(ordinal, stream, out, pixels, weight, g, d_model),
    }
}

/// [`patch_embed_backward`] on `stream`'s device: accumulates the gradients present, f32.
pub fn backward(
    stream: &Stream,
    mut grads: Grads<'_>,
    dout: &BufferView<'_, f32>,
    pixels: &BufferView<'_, f32>,
    weight: &BufferView<'_, f32>,
    g: PatchGeom,
    d_model: usize,
) -> Result<()> {
    let required = [dout.device(), pixels.device(), weight.device()];
    let devices = present(&required, &grads.devices());
    match backend("patch_embed_backward", stream, &devices)? {
        Backend::Cpu => patch_embed_backward(
            grads.host()?,
            dout.as_host_slice()?,
            pixels.as_host_slice()?,
            weight.as_host_slice()?,
            g,
            d_model,
        ),
        Backend::Npu(ordinal) => {
            npu::backward(ordinal, stream, grads, dout, pixels, weight, g, d_model)
        }
    }
}

/// [`patch_embed_forward_bf16`] on `stream`'s device: bf16 products, f32 out.
pub fn forward_bf16<
    P: Bf16Elem + cannon_runtime::Element,
    W: Bf16Elem + cannon_runtime::Element,
>(
    stream: &Stream,
    out: &mut BufferViewMut<'_, f32>,
    pixels: &BufferView<'_, P>,
    weight: &BufferView<'_, W>,
    g: PatchGeom,
    d_model: usize,
) -> Result<()> {
    let devices = [out.device(), pixels.device(), weight.device()];
    match backend("patch_embed_forward_bf16", stream, &devices)? {
        Backend::Cpu => patch_embed_forward_bf16(
            out.as_host_slice_mut()?,
            pixels.as_host_slice()?,
            weight.as_host_slice()?,
            g,
            d_model,
        ),
        Backend::Npu(ordinal) => {
            npu::forward_bf16(ordinal, stream, out, pixels, weight, g, d_model)
        }
    }
}

/// [`patch_embed_backward_bf16`] on `stream`'s device: bf16 products, f32 gradients.
#[allow(clippy::too_many_arguments)]
pub fn backward_bf16<
    G: Bf16Elem + cannon_runtime::Element,
    P: Bf16Elem + cannon_runtime::Element,
    W: Bf16Elem + cannon_runtime::Element,
>(
    stream: &Stream,
    mut grads: Grads<'_>,
    dout: &BufferView<'_, G>,
    pixels: &BufferView<'_, P>,
    weight: &BufferView<'_, W>,
    g: PatchGeom,
    d_model: usize,
) -> Result<()> {
    let required = [dout.device(), pixels.device(), weight.device()];
    let devices = present(&required, &grads.devices());
    match backend("patch_embed_backward_bf16", stream, &devices)? {
        Backend::Cpu => patch_embed_backward_bf16(
            grads.host()?,
            dout.as_host_slice()?,
            pixels.as_host_slice()?,
            weight.as_host_slice()?,
            g,
            d_model,
        ),
        Backend::Npu(ordinal) => {
            npu::backward_bf16(ordinal, stream, grads, dout, pixels, weight, g, d_model)
        }
    }
}
