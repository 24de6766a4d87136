use super::host::{swiglu_backward, swiglu_forward};
use super::*;
use crate::cast::check::{assert_close, dot64, fd_grad, randn, tolerances, wide};
use crate::testutil::{rel_l2, Rng};
use half::bf16;

/// sigmoid as exp(-softplus(-g)) = exp(-ln(1 + e^-g)), a different formula from the
/// kernel's 1 / (1 + e^-g) and accurate in both tails (unlike (1 + tanh(g/2)) / 2).
fn sigmoid(g: f64) -> f64 {
    (-(-g).exp().ln_1p()).exp()
}

fn silu(g: f64) -> f64 {
    g * sigmoid(g)
}

fn ref_forward(gate: &[f64], up: &[f64]) -> Vec<f64> {
    gate.iter().zip(up).map(|(&g, &u)| silu(g) * u).collect()
}

/// d/dg silu(g) = s + g s (1 - s).
fn ref_backward(dh: &[f64], gate: &[f64], up: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let mut dg = Vec::new();
    let mut du = Vec::new();
    for ((&d, &g), &u) in dh.iter().zip(gate).zip(up) {
        let s = sigmoid(g);
        dg.push(d * u * (s + g * s * (1.0 - s)));
        du.push(d * silu(g));
    }
    (dg, du)
}

/// Sizes: empty, 1, odd, around the 16-lane width, and more than one rayon chunk.
const SIZES: [usize; 7] = [0, 1, 15, 17, 333, 4096, 70_001];

fn check_against_reference<E: Float>() {
    let (tol_f, tol_b) = tolerances::<E>();
    let mut rng = Rng::new(20);
    for &n in &SIZES {
        let gate = randn::<E>(&mut rng, n, 3.0); // covers the saturated tails of sigmoid
        let up = randn::<E>(&mut rng, n, 1.0);
        let dh = randn::<E>(&mut rng, n, 1.0);
        let mut h = vec![E::default(); n];
        swiglu_forward(&mut h, &gate, &up).unwrap();
        let case = format!("{} N={n}", E::NAME);
        assert_close(
            &format!("{case} h"),
            &h,
            &ref_forward(&wide(&gate), &wide(&up)),
            tol_f,
        );

        let (mut dg, mut du) = (vec![E::default(); n], vec![E::default(); n]);
        swiglu_backward(&mut dg, &mut du, &dh, &gate, &up).unwrap();
        let (rdg, rdu) = ref_backward(&wide(&dh), &wide(&gate), &wide(&up));
        assert_close(&format!("{case} d_gate"), &dg, &rdg, tol_b);
        assert_close(&format!("{case} d_up"), &du, &rdu, tol_b);

        // Accumulation: a second call adds the same gradients again.
        let (dg1, du1) = (wide(&dg), wide(&du));
        swiglu_backward(&mut dg, &mut du, &dh, &gate, &up).unwrap();
        let twice = |v: &[f64]| v.iter().map(|x| 2.0 * x).collect::<Vec<_>>();
        assert_close(&format!("{case} d_gate acc"), &dg, &twice(&dg1), tol_f);
        assert_close(&format!("{case} d_up acc"), &du, &twice(&du1), tol_f);
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
fn extreme_gates_stay_finite() {
    // Large |g|: silu(g) -> g for g >> 0, -> 0 for g << 0; no inf/NaN from e^-g overflowing.
    // Below g = -88 the kernel's exp saturates, so silu is ~1e-37 instead of ~1e-80: an
    // absolute error far below anything a bf16/f32 activation can carry.
    let gate = [-200.0f32, -90.0, -30.0, 30.0, 90.0, 200.0];
    let up = [1.0f32; 6];
    let mut h = [0.0f32; 6];
    swiglu_forward(&mut h, &gate, &up).unwrap();
    let want = ref_forward(&wide(&gate), &wide(&up));
    for i in 0..6 {
        let err = (h[i] as f64 - want[i]).abs();
        assert!(
            err <= 1e-6 * want[i].abs() + 1e-35,
            "{i}: {h:?} vs {want:?}"
        );
    }
    let (mut dg, mut du) = ([0.0f32; 6], [0.0f32; 6]);
    swiglu_backward(&mut dg, &mut du, &up, &gate, &up).unwrap();
    assert!(dg.iter().chain(&du).all(|v| v.is_finite()), "{dg:?} {du:?}");
}

#[test]
fn gradients_match_finite_differences() {
    let mut rng = Rng::new(21);
    let n = 9;
    let gate: Vec<f64> = (0..n).map(|_| 2.0 * rng.normal()).collect();
    let up: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
    let dh: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
    let fdg = fd_grad(&gate, 1e-5, |g| dot64(&dh, &ref_forward(g, &up)));
    let fdu = fd_grad(&up, 1e-5, |u| dot64(&dh, &ref_forward(&gate, u)));
    let (rdg, rdu) = ref_backward(&dh, &gate, &up);
    assert!(rel_l2(&rdg, &fdg) < 1e-8 && rel_l2(&rdu, &fdu) < 1e-8);
    let f = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<f32>>();
    let (mut dg, mut du) = (vec![0.0f32; n], vec![0.0f32; n]);
    swiglu_backward(&mut dg, &mut du, &f(&dh), &f(&gate), &f(&up)).unwrap();
    assert_close("kernel d_gate vs FD", &dg, &fdg, 1e-4);
    assert_close("kernel d_up vs FD", &du, &fdu, 1e-4);
}

#[test]
fn length_mismatch_is_an_error() {
    let mut h = [0.0f32; 3];
    let e = swiglu_forward(&mut h, &[1.0; 3], &[1.0; 2]).unwrap_err();
    assert!(
        e.to_string().contains("up has 2 elements, expected 3"),
        "{e}"
    );
}
