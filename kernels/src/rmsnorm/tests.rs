use super::host::{rmsnorm_backward, rmsnorm_forward};
use super::*;
use crate::cast::check::{assert_close, dot64, fd_grad, randn, tolerances, wide};
use crate::testutil::Rng;
use half::bf16;

const EPS: f32 = 1e-5;

/// Naive f64 forward, row by row: y = w * x / sqrt(mean(x^2) + eps).
fn ref_forward(x: &[f64], w: &[f64], d: usize) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for (xr, yr) in x.chunks(d).zip(y.chunks_mut(d)) {
        let ms = xr.iter().map(|v| v * v).sum::<f64>() / d as f64;
        let s = 1.0 / (ms + EPS as f64).sqrt();
        for j in 0..d {
            yr[j] = w[j] * xr[j] * s;
        }
    }
    y
}

/// Naive f64 backward through the full Jacobian of each row (O(D^2), a different algorithm
/// from the kernel's closed form): dn_j/dx_i = s (delta_ij - x_i x_j s^2 / D).
fn ref_backward(dy: &[f64], x: &[f64], w: &[f64], d: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut dx, mut dw) = (vec![0.0; x.len()], vec![0.0; d]);
    for ((xr, dyr), dxr) in x.chunks(d).zip(dy.chunks(d)).zip(dx.chunks_mut(d)) {
        let ms = xr.iter().map(|v| v * v).sum::<f64>() / d as f64;
        let s = 1.0 / (ms + EPS as f64).sqrt();
        for i in 0..d {
            for j in 0..d {
                let delta = if i == j { 1.0 } else { 0.0 };
                let dn_dx = s * (delta - xr[i] * xr[j] * s * s / d as f64);
                dxr[i] += dyr[j] * w[j] * dn_dx;
            }
        }
        for j in 0..d {
            dw[j] += dyr[j] * xr[j] * s;
        }
    }
    (dx, dw)
}

/// (T, D) cases: size 1, odd sizes, hidden sizes around and off the 16-lane vector width,
/// and more rows than one rayon task or dw block holds.
const SHAPES: [(usize, usize); 8] = [
    (1, 1),
    (1, 17),
    (3, 16),
    (7, 33),
    (5, 100),
    (2, 255),
    (130, 64),
    (300, 129),
];

fn check_against_reference<E: Float>() {
    let (tol_f, tol_b) = tolerances::<E>();
    let mut rng = Rng::new(10);
    for &(t, d) in &SHAPES {
        // With D = 1 the output is w * x / sqrt(x^2 + eps) ~ w sign(x), and dx ~ eps / x^3
        // is the difference of two nearly equal terms (in any f32 implementation, torch's
        // too). Scaling x so that x^2 ~ eps keeps that case well-conditioned.
        let scale = if d == 1 { 0.003 } else { 1.5 };
        let x = randn::<E>(&mut rng, t * d, scale);
        let w: Vec<E> = (0..d)
            .map(|_| E::from_f32(1.0 + 0.3 * rng.normal() as f32))
            .collect();
        let dy = randn::<E>(&mut rng, t * d, 1.0);
        let (mut out, mut rstd) = (vec![E::default(); t * d], vec![0.0f32; t]);
        rmsnorm_forward(&mut out, &mut rstd, &x, &w, d, EPS).unwrap();
        let case = format!("{} T={t} D={d}", E::NAME);
        assert_close(
            &format!("{case} out"),
            &out,
            &ref_forward(&wide(&x), &wide(&w), d),
            tol_f,
        );

        let (mut dx, mut dw) = (vec![E::default(); t * d], vec![0.0f32; d]);
        rmsnorm_backward(&mut dx, &mut dw, &dy, &x, &w, &rstd, d).unwrap();
        let (rdx, rdw) = ref_backward(&wide(&dy), &wide(&x), &wide(&w), d);
        assert_close(&format!("{case} dx"), &dx, &rdx, tol_b);
        assert_close(&format!("{case} dw"), &dw, &rdw, tol_b);

        // Gradients accumulate: from non-zero buffers the result is start + the above.
        let dx0 = randn::<E>(&mut rng, t * d, 1.0);
        let dw0 = rng.normal_vec(d, 1.0);
        let (mut dxa, mut dwa) = (dx0.clone(), dw0.clone());
        rmsnorm_backward(&mut dxa, &mut dwa, &dy, &x, &w, &rstd, d).unwrap();
        let sum = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x + y).collect::<Vec<_>>();
        assert_close(
            &format!("{case} dx acc"),
            &dxa,
            &sum(&wide(&dx0), &wide(&dx)),
            tol_f,
        );
        assert_close(
            &format!("{case} dw acc"),
            &dwa,
            &sum(&wide(&dw0), &wide(&dw)),
            1e-6,
        );
    }
}

#[test]
fn f32_matches_f64_reference() {
    check_against_reference::<f32>();
}

#[test]
fn bf16_matches_f64_reference() {
    check_against_reference::<bf16>();
}

#[test]
fn bf16_rounds_the_normalised_value_before_the_weight() {
    // transformers: weight * (x * rstd).to(bf16), both products rounded to bf16. Check that
    // exact sequence elementwise (the kernel's rstd equals an f32 computation of it).
    let mut rng = Rng::new(11);
    let d = 37;
    let x = randn::<bf16>(&mut rng, 4 * d, 2.0);
    let w = randn::<bf16>(&mut rng, d, 1.0);
    let (mut out, mut rstd) = (vec![bf16::ZERO; 4 * d], vec![0.0f32; 4]);
    rmsnorm_forward(&mut out, &mut rstd, &x, &w, d, EPS).unwrap();
    for t in 0..4 {
        let xr = &x[t * d..][..d];
        let ms: f64 = xr.iter().map(|v| (v.to_f32() as f64).powi(2)).sum::<f64>() / d as f64;
        let r = 1.0 / (ms + EPS as f64).sqrt();
        assert!(
            (rstd[t] as f64 - r).abs() <= 2e-6 * r,
            "rstd {} vs {r}",
            rstd[t]
        );
        for j in 0..d {
            let n = bf16::from_f32(xr[j].to_f32() * rstd[t]);
            let want = bf16::from_f32(w[j].to_f32() * n.to_f32());
            assert_eq!(out[t * d + j], want, "t={t} j={j}");
        }
    }
}

#[test]
fn gradients_match_finite_differences() {
    // Central differences of L = <dy, rmsnorm(x, w)> in f64 on tiny shapes validate the
    // reference's Jacobian, and the f32 kernel against both (tolerance: gradient 1e-4).
    let mut rng = Rng::new(12);
    for &(t, d) in &[(1usize, 1usize), (2, 3), (3, 5)] {
        let scale = if d == 1 { 0.003 } else { 1.0 }; // see check_against_reference
        let x: Vec<f64> = (0..t * d).map(|_| scale * rng.normal()).collect();
        let w: Vec<f64> = (0..d).map(|_| 1.0 + 0.3 * rng.normal()).collect();
        let dy: Vec<f64> = (0..t * d).map(|_| rng.normal()).collect();
        // h = 1e-5 of the input scale: truncation error ~h^2 ~ 1e-10, rounding 1e-16/h.
        let fdx = fd_grad(&x, 1e-5 * scale, |x| dot64(&dy, &ref_forward(x, &w, d)));
        let fdw = fd_grad(&w, 1e-5, |w| dot64(&dy, &ref_forward(&x, w, d)));
        let (rdx, rdw) = ref_backward(&dy, &x, &w, d);
        let close = |a: &[f64], b: &[f64]| crate::testutil::rel_l2(a, b);
        assert!(
            close(&rdx, &fdx) < 1e-6,
            "reference dx vs FD: {}",
            close(&rdx, &fdx)
        );
        assert!(
            close(&rdw, &fdw) < 1e-6,
            "reference dw vs FD: {}",
            close(&rdw, &fdw)
        );

        let f = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<f32>>();
        let (mut out, mut rstd) = (vec![0.0f32; t * d], vec![0.0f32; t]);
        rmsnorm_forward(&mut out, &mut rstd, &f(&x), &f(&w), d, EPS).unwrap();
        let (mut dx, mut dw) = (vec![0.0f32; t * d], vec![0.0f32; d]);
        rmsnorm_backward(&mut dx, &mut dw, &f(&dy), &f(&x), &f(&w), &rstd, d).unwrap();
        assert_close("kernel dx vs FD", &dx, &fdx, 1e-4);
        assert_close("kernel dw vs FD", &dw, &fdw, 1e-4);
    }
}

#[test]
fn dweight_is_reproducible_bit_for_bit() {
    // The dw reduction order depends on (T, D) only; running twice (rayon may split the work
    // differently) must give identical bits.
    let mut rng = Rng::new(13);
    let (t, d) = (517, 96);
    let x = randn::<f32>(&mut rng, t * d, 1.0);
    let w = randn::<f32>(&mut rng, d, 1.0);
    let dy = randn::<f32>(&mut rng, t * d, 1.0);
    let (mut out, mut rstd) = (vec![0.0; t * d], vec![0.0; t]);
    rmsnorm_forward(&mut out, &mut rstd, &x, &w, d, EPS).unwrap();
    let run = || {
        let (mut dx, mut dw) = (vec![0.0f32; t * d], vec![0.0f32; d]);
        rmsnorm_backward(&mut dx, &mut dw, &dy, &x, &w, &rstd, d).unwrap();
        (dx, dw)
    };
    let (a, b) = (run(), run());
    assert!(a.0 == b.0 && a.1 == b.1);
}

#[test]
fn shape_errors_name_the_argument() {
    let x = vec![0.0f32; 12];
    let w = vec![1.0f32; 4];
    let (mut out, mut rstd) = (vec![0.0f32; 12], vec![0.0f32; 3]);
    let e = rmsnorm_forward(&mut out, &mut rstd, &x, &w, 5, EPS).unwrap_err();
    assert!(
        e.to_string()
            .contains("not a multiple of the hidden size 5"),
        "{e}"
    );
    let e = rmsnorm_forward(&mut out, &mut rstd[..2], &x, &w, 4, EPS).unwrap_err();
    assert!(
        e.to_string().contains("rstd has 2 elements, expected 3"),
        "{e}"
    );
    let (mut dx, mut dw) = (vec![0.0f32; 12], vec![0.0f32; 3]);
    let e = rmsnorm_backward(&mut dx, &mut dw, &x, &x, &w, &rstd, 4).unwrap_err();
    assert!(
        e.to_string().contains("dweight has 3 elements, expected 4"),
        "{e}"
    );
}
