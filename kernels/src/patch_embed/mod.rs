//! patch_embed: Pixtral's patch convolution (Conv2d C -> D, kernel = stride = patch, no bias)
//! as one GEMM over the (c, ky, kx) patch vectors.
//!
//! ```text
//! pixels  [C, H, W]      channels first, as the processor emits; H x W may be padded past
//!                        the real image h x w, which is cropped to gh = h/p by gw = w/p patches
//! weight  [D, C, p, p]   HF's Conv2d layout = [D, K] with K = C*p*p in (c, ky, kx) order
//! P       [Np, K]        im2col: P[py*gw + px][(c*p + ky)*p + kx] = pixels[c][py*p+ky][px*p+kx]
//! forward   out[Np, D]  = P W^T                         (patches in row-major order)
//! backward  dW[D, K]   += dOut^T P                      (optional)
//!           dpixels    += col2im(dOut W)                (optional; only the cropped region)
//! ```
//!
//! The stride equals the kernel, so patches do not overlap and col2im is a scatter. HF crops
//! the conv output to `[:h/p, :w/p]`; computing only those patches is the same thing.
//! f32 and bf16 variants as in `linear`: bf16 pixels/weights/dOut ([`Float`]: bf16, or f32
//! rounded in the product), f32 accumulation and f32 outputs and gradients.

mod cpu;
pub mod device;
pub mod host;
pub(crate) mod npu;

#[cfg(test)]
mod tests;

use crate::cast;
use crate::error::{check_len, KernelError, Result};
use crate::gemm::{not_f32, require_f32};
use crate::gemm::{Bf16, Precision, F32};
use cannon_runtime::BufferViewMut;
use cannon_runtime::Float;

/// The image and patch geometry of one image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PatchGeom {
    /// Input channels C (3 for RGB).
    pub channels: usize,
    /// Stored height H of `pixels` (possibly padded).
    pub height: usize,
    /// Stored width W of `pixels` (possibly padded).
    pub width: usize,
    /// Real image height h <= H.
    pub h: usize,
    /// Real image width w <= W.
    pub w: usize,
    /// Patch size p (kernel = stride).
    pub patch: usize,
}

impl PatchGeom {
    /// Patches down and across: (h / p, w / p).
    pub fn grid(&self) -> (usize, usize) {
        if self.patch == 0 {
            return (0, 0);
        }
        (self.h / self.patch, self.w / self.patch)
    }

    /// Np = (h / p) * (w / p).
    pub fn num_patches(&self) -> usize {
        let (gh, gw) = self.grid();
        gh * gw
    }

    /// K = C * p * p, the length of one patch vector (a row of the weight).
    pub fn patch_len(&self) -> usize {
        self.channels * self.patch * self.patch
    }

    fn check(&self, op: &'static str) -> Result<()> {
        if self.patch == 0 || self.h > self.height || self.w > self.width {
            return Err(KernelError::InvalidArgument {
                op,
                detail: format!(
                    "patch {} must be > 0 and the image {}x{} must fit in the stored {}x{}",
                    self.patch, self.h, self.w, self.height, self.width
                ),
            });
        }
        Ok(())
    }
}

fn check_common(
    op: &'static str,
    g: &PatchGeom,
    d_model: usize,
    pixels: usize,
    weight: usize,
) -> Result<()> {
    g.check(op)?;
    check_len(op, "pixels", pixels, g.channels * g.height * g.width)?;
    check_len(op, "weight", weight, d_model * g.patch_len())
}

/// The gradients a backward call accumulates into; `None` skips one.
pub struct PatchEmbedGrads<'a> {
    /// `[D, C, p, p]`
    pub dweight: Option<&'a mut [f32]>,
    /// `[C, H, W]` (only the cropped `h/p*p x w/p*p` region is touched)
    pub dpixels: Option<&'a mut [f32]>,
}

/// The gradients a device-level backward ([`crate::ops::patch_embed_backward`])
/// accumulates into; `None` skips one.
pub struct PatchEmbedGradBufs<'a> {
    /// `[D, C, p, p]`
    pub dweight: Option<BufferViewMut<'a, f32>>,
    /// `[C, H, W]` (only the cropped region is touched)
    pub dpixels: Option<BufferViewMut<'a, f32>>,
}

impl crate::backend::OnDevice for PatchEmbedGradBufs<'_> {
    fn devices(&self, out: &mut Vec<cannon_runtime::Device>) {
        self.dweight.devices(out);
        self.dpixels.devices(out);
    }
}

impl PatchEmbedGradBufs<'_> {
    /// The slice-level gradients over the same (host) memory.
    pub(crate) fn host(&mut self) -> Result<PatchEmbedGrads<'_>> {
        Ok(PatchEmbedGrads {
            dweight: host_opt(&mut self.dweight)?,
            dpixels: host_opt(&mut self.dpixels)?,
        })
    }
}

/// The host slice of an optional CPU gradient view.
fn host_opt<'s>(v: &'s mut Option<BufferViewMut<'_, f32>>) -> Result<Option<&'s mut [f32]>> {
    Ok(v.as_mut().map(|v| v.as_host_slice_mut()).transpose()?)
}

impl PatchEmbedGrads<'_> {
    /// The lengths of the gradients present: dweight, dpixels.
    fn lens(&self) -> [Option<usize>; 2] {
        [&self.dweight, &self.dpixels].map(|g| g.as_ref().map(|g| g.len()))
    }
}

impl PatchEmbedGradBufs<'_> {
    /// The lengths of the gradients present: dweight, dpixels.
    pub(crate) fn lens(&self) -> [Option<usize>; 2] {
        [&self.dweight, &self.dpixels].map(|g| g.as_ref().map(|g| g.len()))
    }
}

/// The rules of [`patch_embed_forward`](host::patch_embed_forward) on every backend (the device-level entry point
/// checks them before any backend runs): a valid geometry, pixels `[C, H, W]`, weight `[D,
/// C, p, p]`, out `[Np, D]` (lengths), and f32 operands under `Precision::F32`.
pub(crate) fn check_forward<P: Float, W: Float>(
    p: Precision,
    g: &PatchGeom,
    d_model: usize,
    out: usize,
    pixels: usize,
    weight: usize,
) -> Result<()> {
    let op = "patch_embed_forward";
    check_common(op, g, d_model, pixels, weight)?;
    check_len(op, "out", out, g.num_patches() * d_model)?;
    require_f32(op, p, &[("pixels", P::DTYPE), ("weight", W::DTYPE)])
}

/// The rules of [`patch_embed_backward`](host::patch_embed_backward) on every backend: as [`check_forward`]'s for the
/// geometry, pixels and weight, dout `[Np, D]`, the gradients present (`[dweight,
/// dpixels]`, lengths) shaped as weight and pixels, and f32 operands under `Precision::F32`.
pub(crate) fn check_backward<G: Float, P: Float, W: Float>(
    p: Precision,
    g: &PatchGeom,
    d_model: usize,
    [dweight, dpixels]: [Option<usize>; 2],
    dout: usize,
    pixels: usize,
    weight: usize,
) -> Result<()> {
    let op = "patch_embed_backward";
    check_common(op, g, d_model, pixels, weight)?;
    check_len(op, "dout", dout, g.num_patches() * d_model)?;
    if let Some(dw) = dweight {
        check_len(op, "dweight", dw, d_model * g.patch_len())?;
    }
    if let Some(dp) = dpixels {
        check_len(op, "dpixels", dp, g.channels * g.height * g.width)?;
    }
    let dtypes = [
        ("dout", G::DTYPE),
        ("pixels", P::DTYPE),
        ("weight", W::DTYPE),
    ];
    require_f32(op, p, &dtypes)
}
