//! CPU patch embedding: im2col into a `[Np, K]` patch matrix (threaded over patch rows), one
//! GEMM, and for the input gradient a GEMM into `[Np, K]` scattered back by col2im.
//! Lengths and geometry were checked by mod.rs.

use super::{PatchEmbedGrads, PatchGeom};
use crate::error::Result;
use crate::gemm::{Dims, Products, Trans};
use rayon::prelude::*;

/// `P[Np, K]` with `P[py*gw + px][(c*p + ky)*p + kx] = pixels[c][py*p + ky][px*p + kx]`.
fn im2col<T: Copy + Send + Sync>(pixels: &[T], g: PatchGeom) -> Vec<T> {
    let (gh, gw) = g.grid();
    let (p, k) = (g.patch, g.patch_len());
    let plane = g.height * g.width;
    if gh * gw * k == 0 {
        return Vec::new();
    }
    let mut out = vec![pixels[0]; gh * gw * k];
    out.par_chunks_mut(gw * k)
        .enumerate()
        .for_each(|(py, row)| {
            for (px, patch) in row.chunks_mut(k).enumerate() {
                for c in 0..g.channels {
                    for ky in 0..p {
                        let src = c * plane + (py * p + ky) * g.width + px * p;
                        let dst = (c * p + ky) * p;
                        patch[dst..dst + p].copy_from_slice(&pixels[src..src + p]);
                    }
                }
            }
        });
    out
}

/// `dpixels[c][py*p + ky][px*p + kx] += dp[py*gw + px][(c*p + ky)*p + kx]`. Patches do not
/// overlap, so each pixel receives at most one term.
fn col2im_add(dpixels: &mut [f32], dp: &[f32], g: PatchGeom) {
    let (gh, gw) = g.grid();
    let (p, k) = (g.patch, g.patch_len());
    let plane = g.height * g.width;
    if gh * gw * k == 0 {
        return;
    }
    for c in 0..g.channels {
        let chan = &mut dpixels[c * plane..(c + 1) * plane];
        // One task per band of p image rows (one patch row): disjoint pixel rows.
        chan.par_chunks_mut(p * g.width)
            .take(gh)
            .enumerate()
            .for_each(|(py, band)| {
                for px in 0..gw {
                    let patch = &dp[(py * gw + px) * k..][..k];
                    for ky in 0..p {
                        let dst = &mut band[ky * g.width + px * p..][..p];
                        let src = &patch[(c * p + ky) * p..][..p];
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d += s;
                        }
                    }
                }
            });
    }
}

/// `out[Np, D] = P[Np, K] W[D, K]^T` in precision `Pr`.
pub(super) fn forward<Pr: Products<P, W>, P: Copy + Send + Sync, W>(
    out: &mut [f32],
    pixels: &[P],
    weight: &[W],
    g: PatchGeom,
    d_model: usize,
) -> Result<()> {
    let (np, k) = (g.num_patches(), g.patch_len());
    let patches = im2col(pixels, g);
    let d = Dims {
        m: np,
        n: d_model,
        k,
    };
    Pr::gemm(
        Trans::N,
        Trans::T,
        d,
        1.0,
        &patches,
        k,
        weight,
        k,
        0.0,
        out,
        d_model,
    )
}

/// The requested gradients (weight accumulated, pixels accumulated) in precision `Pr`.
pub(super) fn backward<Pr, G, P: Copy + Send + Sync, W>(
    grads: PatchEmbedGrads,
    dout: &[G],
    pixels: &[P],
    weight: &[W],
    g: PatchGeom,
    d_model: usize,
) -> Result<()>
where
    Pr: Products<G, P> + Products<G, W>,
{
    let (np, k) = (g.num_patches(), g.patch_len());
    if let Some(dw) = grads.dweight {
        // dW[D, K] += dOut[Np, D]^T P[Np, K]
        let patches = im2col(pixels, g);
        let d = Dims {
            m: d_model,
            n: k,
            k: np,
        };
        <Pr as Products<G, P>>::gemm(
            Trans::T,
            Trans::N,
            d,
            1.0,
            dout,
            d_model,
            &patches,
            k,
            1.0,
            dw,
            k,
        )?;
    }
    if let Some(dpix) = grads.dpixels {
        // dP[Np, K] = dOut[Np, D] W[D, K]
        let mut dp = vec![0.0f32; np * k];
        let d = Dims {
            m: np,
            n: k,
            k: d_model,
        };
        <Pr as Products<G, W>>::gemm(
            Trans::N,
            Trans::N,
            d,
            1.0,
            dout,
            d_model,
            weight,
            k,
            0.0,
            &mut dp,
            k,
        )?;
        col2im_add(dpix, &dp, g);
    }
    Ok(())
}
