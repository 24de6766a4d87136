use super::host::{gelu_backward, gelu_forward};
use super::*;
use crate::cast::check::{assert_close, dot64, fd_grad, randn, tolerances, wide};
use crate::testutil::{rel_l2, Rng};
use half::bf16;
use std::f64::consts::PI;

/// erf(z) by its everywhere-convergent series of positive terms:
/// erf(z) = 2/sqrt(pi) e^(-z^2) sum_n 2^n z^(2n+1) / (1 3 5 ... (2n+1)).
fn erf_series(z: f64) -> f64 {
    let (mut term, mut sum, mut n) = (z, z, 0.0);
    while term.abs() > 1e-18 * sum.abs() {
        n += 1.0;
        term *= 2.0 * z * z / (2.0 * n + 1.0);
        sum += term;
    }
    2.0 / PI.sqrt() * (-z * z).exp() * sum
}

/// erfc(z) for z >= 2.5 by its continued fraction (Lentz), accurate where 1 - erf cancels:
/// erfc(z) = e^(-z^2)/sqrt(pi) * 1/(z + (1/2)/(z + 1/(z + (3/2)/(z + 2/(z + ...))))).
fn erfc_cf(z: f64) -> f64 {
    let mut f = 0.0;
    for k in (1..200).rev() {
        f = (k as f64 / 2.0) / (z + f);
    }
    (-z * z).exp() / PI.sqrt() / (z + f)
}

/// Phi(x) in f64 from the two classical expansions above.
fn phi_ref(x: f64) -> f64 {
    let z = -x / 2f64.sqrt();
    let erfc = if z >= 2.5 {
        erfc_cf(z)
    } else if z <= -2.5 {
        2.0 - erfc_cf(-z)
    } else {
        1.0 - erf_series(z)
    };
    0.5 * erfc
}

fn ref_forward(x: &[f64]) -> Vec<f64> {
    x.iter().map(|&v| v * phi_ref(v)).collect()
}

fn ref_backward(dy: &[f64], x: &[f64]) -> Vec<f64> {
    let pdf = |v: f64| (-0.5 * v * v).exp() / (2.0 * PI).sqrt();
    dy.iter()
        .zip(x)
        .map(|(&d, &v)| d * (phi_ref(v) + v * pdf(v)))
        .collect()
}

#[test]
fn normal_cdf_has_small_relative_error_everywhere() {
    // Elementwise relative error, including the far negative tail where Phi ~ 1e-38: the
    // erfc fit's 1.2e-7 plus f32 roundings of the exponent argument a ~ -x^2/2 - 1.3, whose
    // absolute error (a few ulp of |a|, ~2e-7 |a|) becomes a relative error of Phi.
    // Below x = -13 Phi leaves f32's normal range.
    let mut worst: f64 = 0.0;
    for i in 0..=26_000 {
        let x = (-13.0 + i as f64 * 0.001) as f32 as f64;
        let (got, want) = (normal_cdf(x as f32) as f64, phi_ref(x));
        let bound = 1.2e-7 + 2.4e-7 * (1.3 + 0.5 * x * x);
        let rel = (got - want).abs() / want;
        assert!(
            rel <= bound,
            "x = {x}: Phi {got:e} vs {want:e}, rel {rel:e} > {bound:e}"
        );
        worst = worst.max(rel / bound);
    }
    assert!(worst > 0.0, "the comparison must see some rounding");
}

/// Sizes: empty, 1, odd, around the 16-lane width, and more than one rayon chunk.
const SIZES: [usize; 6] = [0, 1, 17, 100, 4099, 70_001];

fn check_against_reference<E: Float>() {
    let (tol_f, tol_b) = tolerances::<E>();
    let mut rng = Rng::new(30);
    for &n in &SIZES {
        let x = randn::<E>(&mut rng, n, 2.5);
        let dy = randn::<E>(&mut rng, n, 1.0);
        let mut y = vec![E::default(); n];
        gelu_forward(&mut y, &x).unwrap();
        let case = format!("{} N={n}", E::NAME);
        assert_close(&format!("{case} y"), &y, &ref_forward(&wide(&x)), tol_f);
        let mut dx = vec![E::default(); n];
        gelu_backward(&mut dx, &dy, &x).unwrap();
        assert_close(
            &format!("{case} dx"),
            &dx,
            &ref_backward(&wide(&dy), &wide(&x)),
            tol_b,
        );
        // Accumulation: a second call adds the same gradient again.
        let first = wide(&dx);
        gelu_backward(&mut dx, &dy, &x).unwrap();
        let twice: Vec<f64> = first.iter().map(|v| 2.0 * v).collect();
        assert_close(&format!("{case} dx acc"), &dx, &twice, tol_f);
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
fn gradient_matches_finite_differences() {
    let mut rng = Rng::new(31);
    let x: Vec<f64> = (0..11).map(|_| 2.0 * rng.normal()).collect();
    let dy: Vec<f64> = (0..11).map(|_| rng.normal()).collect();
    let fd = fd_grad(&x, 1e-5, |x| dot64(&dy, &ref_forward(x)));
    assert!(rel_l2(&ref_backward(&dy, &x), &fd) < 1e-8);
    let f = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<f32>>();
    let mut dx = vec![0.0f32; 11];
    gelu_backward(&mut dx, &f(&dy), &f(&x)).unwrap();
    assert_close("kernel dx vs FD", &dx, &fd, 1e-4);
}

#[test]
fn special_values() {
    let x = [
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-30,
        -200.0,
    ];
    let mut y = [1.0f32; 7];
    gelu_forward(&mut y, &x).unwrap();
    assert_eq!(&y[..2], &[0.0, 0.0]);
    assert_eq!(y[2], f32::INFINITY);
    assert!(y[4].is_nan());
    assert!((y[5] - 5e-31).abs() < 1e-36);
    assert!(y[6] <= 0.0 && y[6] > -1e-30, "gelu(-200) = {}", y[6]);
}
