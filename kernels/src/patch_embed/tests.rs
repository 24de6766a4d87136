//! patch_embed against a float64 direct convolution (no im2col), finite differences of that
//! float64 forward, crop/padding behaviour and the bf16 paths.

use super::host::{patch_embed_backward, patch_embed_forward};
use super::*;
use crate::gemm::Precision;
use crate::testutil::{rel_l2, Rng};
use half::bf16;

/// Float64 stride-p convolution over the cropped grid, written as the conv sum itself.
fn conv_f64(pix: &[f64], w: &[f64], g: PatchGeom, dm: usize) -> Vec<f64> {
    let (gh, gw) = g.grid();
    let p = g.patch;
    let mut out = vec![0.0; gh * gw * dm];
    for py in 0..gh {
        for px in 0..gw {
            for o in 0..dm {
                let mut s = 0.0;
                for c in 0..g.channels {
                    for ky in 0..p {
                        for kx in 0..p {
                            let (y, x) = (py * p + ky, px * p + kx);
                            let pv = pix[(c * g.height + y) * g.width + x];
                            s += pv * w[((o * g.channels + c) * p + ky) * p + kx];
                        }
                    }
                }
                out[(py * gw + px) * dm + o] = s;
            }
        }
    }
    out
}

/// Float64 gradients of `L = sum(dout * out)` by the conv's chain rule, added to `dw0`/`dp0`.
fn conv_backward_f64(
    dout: &[f64],
    pix: &[f64],
    w: &[f64],
    g: PatchGeom,
    dm: usize,
    dw0: &[f64],
    dp0: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let (gh, gw) = g.grid();
    let p = g.patch;
    let (mut dw, mut dp) = (dw0.to_vec(), dp0.to_vec());
    for py in 0..gh {
        for px in 0..gw {
            for o in 0..dm {
                let go = dout[(py * gw + px) * dm + o];
                for c in 0..g.channels {
                    for ky in 0..p {
                        for kx in 0..p {
                            let pi = (c * g.height + py * p + ky) * g.width + px * p + kx;
                            let wi = ((o * g.channels + c) * p + ky) * p + kx;
                            dw[wi] += go * pix[pi];
                            dp[pi] += go * w[wi];
                        }
                    }
                }
            }
        }
    }
    (dw, dp)
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// Geometries: exact fit, padded stored size with a real size that is not a multiple of p
/// (cropped), one patch, a Pixtral-like 14-pixel patch, two channels, a wider crop.
fn geoms() -> Vec<(PatchGeom, usize)> {
    let g = |channels, height, width, h, w, patch| PatchGeom {
        channels,
        height,
        width,
        h,
        w,
        patch,
    };
    vec![
        (g(3, 8, 8, 8, 8, 2), 5),
        (g(3, 11, 13, 9, 12, 4), 7),
        (g(1, 3, 3, 3, 3, 3), 1),
        (g(3, 42, 56, 42, 42, 14), 33),
        (g(2, 10, 10, 7, 10, 3), 20),
        (g(3, 32, 40, 30, 40, 4), 24),
    ]
}

struct Data {
    pix: Vec<f32>,
    w: Vec<f32>,
    dout: Vec<f32>,
    dw0: Vec<f32>,
    dp0: Vec<f32>,
}

fn data(rng: &mut Rng, g: PatchGeom, dm: usize) -> Data {
    let npix = g.channels * g.height * g.width;
    Data {
        pix: rng.normal_vec(npix, 1.0),
        w: rng.normal_vec(dm * g.patch_len(), 0.3),
        dout: rng.normal_vec(g.num_patches() * dm, 1.0),
        dw0: rng.normal_vec(dm * g.patch_len(), 1.0),
        dp0: rng.normal_vec(npix, 1.0),
    }
}

// f32 bars of DESIGN.md: forward 1e-5, gradients 1e-4 (f32 GEMM rounding is ~1e-7).
#[test]
fn f32_forward_and_backward_match_f64_conv() {
    let mut rng = Rng::new(31);
    for (g, dm) in geoms() {
        let v = data(&mut rng, g, dm);
        let mut out = vec![f32::NAN; g.num_patches() * dm];
        patch_embed_forward(Precision::F32, &mut out, &v.pix, &v.w, g, dm).unwrap();
        let r = conv_f64(&f64s(&v.pix), &f64s(&v.w), g, dm);
        let e = rel_l2(&out, &r);
        assert!(e <= 1e-5, "{g:?}: forward rel_l2 {e:e}");

        let (mut dw, mut dp) = (v.dw0.clone(), v.dp0.clone());
        let grads = PatchEmbedGrads {
            dweight: Some(&mut dw),
            dpixels: Some(&mut dp),
        };
        patch_embed_backward(Precision::F32, grads, &v.dout, &v.pix, &v.w, g, dm).unwrap();
        let (rw, rp) = conv_backward_f64(
            &f64s(&v.dout),
            &f64s(&v.pix),
            &f64s(&v.w),
            g,
            dm,
            &f64s(&v.dw0),
            &f64s(&v.dp0),
        );
        let e = rel_l2(&dw, &rw);
        assert!(e <= 1e-4, "{g:?}: dweight rel_l2 {e:e}");
        let e = rel_l2(&dp, &rp);
        assert!(e <= 1e-4, "{g:?}: dpixels rel_l2 {e:e}");
    }
}

/// Pixels outside the cropped grid (padding, and the remainder of a size that is not a
/// multiple of p) change nothing in the output and receive no gradient.
#[test]
fn padding_is_ignored_and_gets_no_gradient() {
    let mut rng = Rng::new(32);
    let g = PatchGeom {
        channels: 3,
        height: 11,
        width: 13,
        h: 9,
        w: 12,
        patch: 4,
    };
    let dm = 6;
    let v = data(&mut rng, g, dm);
    let (gh, gw) = g.grid();
    let inside = |i: usize| {
        let (y, x) = ((i / g.width) % g.height, i % g.width);
        y < gh * g.patch && x < gw * g.patch
    };
    let mut pix2 = v.pix.clone();
    for (i, p) in pix2.iter_mut().enumerate() {
        if !inside(i) {
            *p = 1e6;
        }
    }
    let (mut o1, mut o2) = (vec![0.0; gh * gw * dm], vec![0.0; gh * gw * dm]);
    patch_embed_forward(Precision::F32, &mut o1, &v.pix, &v.w, g, dm).unwrap();
    patch_embed_forward(Precision::F32, &mut o2, &pix2, &v.w, g, dm).unwrap();
    assert_eq!(o1, o2);
    let mut dp = vec![0.0f32; v.pix.len()];
    let grads = PatchEmbedGrads {
        dweight: None,
        dpixels: Some(&mut dp),
    };
    patch_embed_backward(Precision::F32, grads, &v.dout, &v.pix, &v.w, g, dm).unwrap();
    assert!(dp.iter().enumerate().all(|(i, &d)| inside(i) || d == 0.0));
    assert!(dp.iter().any(|&d| d != 0.0));
}

/// The chain-rule formulas against central differences of the float64 conv, tiny shape;
/// L is linear in each input, so only cancellation error (~1e-10 relative at h = 1e-6).
#[test]
fn gradient_formulas_match_finite_differences() {
    let mut rng = Rng::new(33);
    let g = PatchGeom {
        channels: 3,
        height: 5,
        width: 7,
        h: 4,
        w: 6,
        patch: 2,
    };
    let dm = 3;
    let v = data(&mut rng, g, dm);
    let (pix, w, gout) = (f64s(&v.pix), f64s(&v.w), f64s(&v.dout));
    let loss = |pix: &[f64], w: &[f64]| -> f64 {
        let out = conv_f64(pix, w, g, dm);
        out.iter().zip(&gout).map(|(a, b)| a * b).sum()
    };
    let (zw, zp) = (vec![0.0; w.len()], vec![0.0; pix.len()]);
    let (aw, ap) = conv_backward_f64(&gout, &pix, &w, g, dm, &zw, &zp);
    let h = 1e-6;
    let num_w: Vec<f64> = (0..w.len())
        .map(|i| {
            let (mut wp, mut wm) = (w.clone(), w.clone());
            wp[i] += h;
            wm[i] -= h;
            (loss(&pix, &wp) - loss(&pix, &wm)) / (2.0 * h)
        })
        .collect();
    let num_p: Vec<f64> = (0..pix.len())
        .map(|i| {
            let (mut pp, mut pm) = (pix.clone(), pix.clone());
            pp[i] += h;
            pm[i] -= h;
            (loss(&pp, &w) - loss(&pm, &w)) / (2.0 * h)
        })
        .collect();
    assert!(rel_l2(&aw, &num_w) <= 1e-7, "dW formula vs FD");
    // Padding pixels have zero numerical gradient too; compare the full vectors.
    assert!(rel_l2(&ap, &num_p) <= 1e-7, "dpixels formula vs FD");
    // The kernel computes those formulas.
    let (mut dw, mut dp) = (vec![0.0f32; w.len()], vec![0.0f32; pix.len()]);
    let grads = PatchEmbedGrads {
        dweight: Some(&mut dw),
        dpixels: Some(&mut dp),
    };
    patch_embed_backward(Precision::F32, grads, &v.dout, &v.pix, &v.w, g, dm).unwrap();
    assert!(rel_l2(&dw, &aw) <= 1e-6);
    assert!(rel_l2(&dp, &ap) <= 1e-6);
}

fn rounded64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| bf16::from_f32(x).to_f64()).collect()
}

/// bf16: DESIGN.md bars against float64 of the unrounded inputs (0.015 forward, 0.04
/// gradients), and f32 accuracy (1e-5) against float64 of the rounded inputs.
#[test]
fn bf16_forward_and_backward_match_f64_conv() {
    let mut rng = Rng::new(34);
    for (g, dm) in geoms()
        .into_iter()
        .filter(|(g, dm)| g.num_patches() * dm >= 100)
    {
        let v = data(&mut rng, g, dm);
        let ph: Vec<bf16> = v.pix.iter().map(|&x| bf16::from_f32(x)).collect();
        let wh: Vec<bf16> = v.w.iter().map(|&x| bf16::from_f32(x)).collect();
        let mut out = vec![0.0f32; g.num_patches() * dm];
        patch_embed_forward(Precision::Bf16, &mut out, &ph, &wh, g, dm).unwrap();
        let exact = conv_f64(&f64s(&v.pix), &f64s(&v.w), g, dm);
        let rounded = conv_f64(&rounded64(&v.pix), &rounded64(&v.w), g, dm);
        let e = rel_l2(&out, &exact);
        assert!(e <= 0.015, "{g:?}: bf16 forward vs exact {e:e}");
        let e = rel_l2(&out, &rounded);
        assert!(e <= 1e-5, "{g:?}: bf16 forward vs rounded {e:e}");

        let (mut dw, mut dp) = (v.dw0.clone(), v.dp0.clone());
        let grads = PatchEmbedGrads {
            dweight: Some(&mut dw),
            dpixels: Some(&mut dp),
        };
        patch_embed_backward(Precision::Bf16, grads, &v.dout, &ph, &wh, g, dm).unwrap();
        let (f, f0w, f0p) = (f64s(&v.dout), f64s(&v.dw0), f64s(&v.dp0));
        let (ew, ep) = conv_backward_f64(&f, &f64s(&v.pix), &f64s(&v.w), g, dm, &f0w, &f0p);
        let e = rel_l2(&dw, &ew);
        assert!(e <= 0.04, "{g:?}: bf16 dweight vs exact {e:e}");
        let e = rel_l2(&dp, &ep);
        assert!(e <= 0.04, "{g:?}: bf16 dpixels vs exact {e:e}");
        let (rw, rp) = conv_backward_f64(
            &rounded64(&v.dout),
            &rounded64(&v.pix),
            &rounded64(&v.w),
            g,
            dm,
            &f0w,
            &f0p,
        );
        assert!(rel_l2(&dw, &rw) <= 1e-5, "{g:?}: bf16 dweight vs rounded");
        assert!(rel_l2(&dp, &rp) <= 1e-5, "{g:?}: bf16 dpixels vs rounded");
    }
}

#[test]
fn bad_geometry_and_lengths_are_errors() {
    let g = PatchGeom {
        channels: 3,
        height: 4,
        width: 4,
        h: 4,
        w: 4,
        patch: 2,
    };
    let (pix, w, mut out) = (vec![0.0f32; 48], vec![0.0f32; 5 * 12], vec![0.0f32; 4 * 5]);
    assert!(patch_embed_forward(Precision::F32, &mut out, &pix, &w, g, 5).is_ok());
    let r = patch_embed_forward(Precision::F32, &mut out, &pix[..47], &w, g, 5);
    assert!(matches!(r, Err(KernelError::Shape { .. })));
    let r = patch_embed_forward(Precision::F32, &mut out[..19], &pix, &w, g, 5);
    assert!(matches!(r, Err(KernelError::Shape { .. })));
    let too_big = PatchGeom { h: 5, ..g };
    let r = patch_embed_forward(Precision::F32, &mut out, &pix, &w, too_big, 5);
    assert!(matches!(r, Err(KernelError::InvalidArgument { .. })));
    let zero_patch = PatchGeom { patch: 0, ..g };
    let r = patch_embed_forward(Precision::F32, &mut out, &pix, &w, zero_patch, 5);
    assert!(matches!(r, Err(KernelError::InvalidArgument { .. })));
    let mut dp = vec![0.0f32; 47];
    let grads = PatchEmbedGrads {
        dweight: None,
        dpixels: Some(&mut dp),
    };
    let r = patch_embed_backward(Precision::F32, grads, &out, &pix, &w, g, 5);
    assert!(matches!(r, Err(KernelError::Shape { .. })));
}
