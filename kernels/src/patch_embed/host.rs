//! The slice-level API of [`super`] on host memory: the CPU kernels themselves, each
//! checking the op's rules and running the code of `cpu.rs`. [`crate::ops`] runs these on
//! the buffers' host slices when the stream is on the CPU.

use super::*;

/// `out[Np, D] = im2col(pixels) W^T` in precision `p` (f32 output; under `Bf16` pixels and
/// weight are bf16 or f32 rounded to bf16 in the product, with f32 accumulation).
pub fn patch_embed_forward<P: Float, W: Float>(
    p: Precision,
    out: &mut [f32],
    pixels: &[P],
    weight: &[W],
    g: PatchGeom,
    d_model: usize,
) -> Result<()> {
    let op = "patch_embed_forward";
    check_forward::<P, W>(p, &g, d_model, out.len(), pixels.len(), weight.len())?;
    match p {
        Precision::F32 => {
            let pixels = cast::as_f32(pixels).ok_or_else(|| not_f32(op, "pixels"))?;
            let weight = cast::as_f32(weight).ok_or_else(|| not_f32(op, "weight"))?;
            cpu::forward::<F32, _, _>(out, pixels, weight, g, d_model)
        }
        Precision::Bf16 => cpu::forward::<Bf16, _, _>(out, pixels, weight, g, d_model),
    }
}

/// Accumulates `dW += dOut^T P` and `dpixels += col2im(dOut W)` (each if present) in
/// precision `p`; gradients are f32 in both.
pub fn patch_embed_backward<G: Float, P: Float, W: Float>(
    p: Precision,
    grads: PatchEmbedGrads,
    dout: &[G],
    pixels: &[P],
    weight: &[W],
    g: PatchGeom,
    d_model: usize,
) -> Result<()> {
    let op = "patch_embed_backward";
    let (dl, pl, wl) = (dout.len(), pixels.len(), weight.len());
    check_backward::<G, P, W>(p, &g, d_model, grads.lens(), dl, pl, wl)?;
    match p {
        Precision::F32 => {
            let dout = cast::as_f32(dout).ok_or_else(|| not_f32(op, "dout"))?;
            let pixels = cast::as_f32(pixels).ok_or_else(|| not_f32(op, "pixels"))?;
            let weight = cast::as_f32(weight).ok_or_else(|| not_f32(op, "weight"))?;
            cpu::backward::<F32, _, _, _>(grads, dout, pixels, weight, g, d_model)
        }
        Precision::Bf16 => cpu::backward::<Bf16, _, _, _>(grads, dout, pixels, weight, g, d_model),
    }
}
