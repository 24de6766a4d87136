//! patch_embed on runtime buffers: the device-level entry points
//! (re-exported by [`crate::ops`]).
//!
//! Each runs the op's check (the rule its slice-level function and NPU body apply too, so
//! the meta device rejects what the CPU would), selects the backend once (every operand on
//! the stream's device, [`backend::select`]), and matches on it: the CPU arm
//! ([`on_cpu`]) borrows the buffers' host slices for [`super::host`], the NPU arm is the
//! op's aclnn body (`npu.rs`), the meta arm computes nothing.

use super::npu;
use super::{PatchEmbedGradBufs, PatchGeom};
use crate::backend::{self, Npu, Selected};
use crate::error::Result;
use crate::gemm::Precision;
use cannon_runtime::trace;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// [`crate::patch_embed::host::patch_embed_forward`] on `stream`'s device:
/// `out = im2col(pixels) weight^T` in precision `p` ([`crate::patch_embed`]).
pub fn patch_embed_forward<P: Float, W: Float>(
    stream: &Stream,
    p: Precision,
    out: &mut BufferViewMut<'_, f32>,
    pixels: &BufferView<'_, P>,
    weight: &BufferView<'_, W>,
    g: PatchGeom,
    d_model: usize,
) -> Result<()> {
    let (ol, pl, wl) = (out.len(), pixels.len(), weight.len());
    super::check_forward::<P, W>(p, &g, d_model, ol, pl, wl)?;
    let _span = trace::span_on(stream, "patch_embed_forward", trace::Cat::Gemm);
    match backend::select("patch_embed_forward", stream, &[&out, &pixels, &weight])? {
        Selected::Cpu(_) => on_cpu::patch_embed_forward(p, out, pixels, weight, g, d_model),
        Selected::Npu(Npu { ordinal }) => {
            npu::forward(ordinal, stream, p, out, pixels, weight, g, d_model)
        }
        Selected::Meta(_) => Ok(()),
    }
}

/// [`crate::patch_embed::host::patch_embed_backward`] on `stream`'s device:
/// Accumulates the gradients present in `grads`, in precision `p`.
#[allow(clippy::too_many_arguments)]
pub fn patch_embed_backward<G: Float, P: Float, W: Float>(
    stream: &Stream,
    p: Precision,
    grads: PatchEmbedGradBufs<'_>,
    dout: &BufferView<'_, G>,
    pixels: &BufferView<'_, P>,
    weight: &BufferView<'_, W>,
    g: PatchGeom,
    d_model: usize,
) -> Result<()> {
    let (gl, dl) = (grads.lens(), dout.len());
    let (pl, wl) = (pixels.len(), weight.len());
    super::check_backward::<G, P, W>(p, &g, d_model, gl, dl, pl, wl)?;
    let _span = trace::span_on(stream, "patch_embed_backward", trace::Cat::Gemm);
    match backend::select(
        "patch_embed_backward",
        stream,
        &[&grads, &dout, &pixels, &weight],
    )? {
        Selected::Cpu(_) => {
            on_cpu::patch_embed_backward(p, grads, dout, pixels, weight, g, d_model)
        }
        Selected::Npu(Npu { ordinal }) => {
            npu::backward(ordinal, stream, p, grads, dout, pixels, weight, g, d_model)
        }
        Selected::Meta(_) => Ok(()),
    }
}

/// The CPU arm of each entry point: the buffers' host slices passed to the slice-level
/// function, without the entry's check or device selection (the slice-level function checks
/// by itself; tests compare the two).
pub mod on_cpu {
    use super::*;
    use crate::patch_embed::host;

    pub fn patch_embed_forward<P: Float, W: Float>(
        p: Precision,
        out: &mut BufferViewMut<'_, f32>,
        pixels: &BufferView<'_, P>,
        weight: &BufferView<'_, W>,
        g: PatchGeom,
        d_model: usize,
    ) -> Result<()> {
        let (pixels, weight) = (pixels.as_host_slice()?, weight.as_host_slice()?);
        host::patch_embed_forward(p, out.as_host_slice_mut()?, pixels, weight, g, d_model)
    }

    pub fn patch_embed_backward<G: Float, P: Float, W: Float>(
        p: Precision,
        mut grads: PatchEmbedGradBufs<'_>,
        dout: &BufferView<'_, G>,
        pixels: &BufferView<'_, P>,
        weight: &BufferView<'_, W>,
        g: PatchGeom,
        d_model: usize,
    ) -> Result<()> {
        let dout = dout.as_host_slice()?;
        let (pixels, weight) = (pixels.as_host_slice()?, weight.as_host_slice()?);
        host::patch_embed_backward(p, grads.host()?, dout, pixels, weight, g, d_model)
    }
}
