//! GELU (aclnnGeluV2 / aclnnGeluBackwardV2, erf form) on the NPU against a float64 reference,
//! with the project's bars (`cannon_kernels::tolerance`): f32 forward <= 1e-5 and gradient
//! <= 1e-4, as the CPU kernel is held to; bf16 forward <= 0.015, gradient <= 0.04. It is also
//! compared with the CPU path (the emulator runs that kernel: equal up to the rounding of
//! the op's written gradient before it is accumulated).

use crate::{bf, down, f64s, streams, up};
use cannon_kernels::ops;
use cannon_kernels::testutil::{rel_l2, Rng};
use cannon_kernels::tolerance::Tolerances;
use cannon_runtime::{DType, DeviceBuffer, Float, Stream};
use half::bf16;
use std::f64::consts::PI;

/// erf(z) in f64 by its everywhere-convergent series of positive terms,
/// erf(z) = 2/sqrt(pi) e^(-z^2) sum_n 2^n z^(2n+1) / (1 3 5 ... (2n+1)); accurate to ~1e-15
/// relative for the |z| < 6 used here (no cancellation: every term is positive).
fn erf(z: f64) -> f64 {
    let (mut term, mut sum, mut n) = (z, z, 0.0);
    while term.abs() > 1e-18 * sum.abs().max(1e-300) {
        n += 1.0;
        term *= 2.0 * z * z / (2.0 * n + 1.0);
        sum += term;
    }
    2.0 / PI.sqrt() * (-z * z).exp() * sum
}

/// Phi(x), the standard normal CDF.
fn phi(x: f64) -> f64 {
    0.5 * (1.0 + erf(x / 2f64.sqrt()))
}

fn gelu<E: Float>(conv: impl Fn(&[f32]) -> Vec<E>, tol: Tolerances, cpu_tol: f64) {
    let (_g, c, n) = streams();
    let mut rng = Rng::new(21);
    // Sizes: one element, odd, and more than one 32-byte unit of either dtype.
    for len in [1usize, 17, 4099] {
        let x = conv(&rng.normal_vec(len, 2.5));
        let dy = conv(&rng.normal_vec(len, 1.0));
        let acc = conv(&rng.normal_vec(len, 1.0));
        let run = |s: &Stream| {
            let (xb, dyb) = (up(s, &x), up(s, &dy));
            let mut y = DeviceBuffer::<E>::alloc(s, len).unwrap();
            ops::gelu_forward(s, &mut y.view_mut(), &xb.view()).unwrap();
            // dx starts at `acc`: the backward accumulates.
            let mut dx = up(s, &acc);
            ops::gelu_backward(s, &mut dx.view_mut(), &dyb.view(), &xb.view()).unwrap();
            (down(s, &y), down(s, &dx))
        };
        let (cr, nr) = (run(&c), run(&n));
        let (xw, dyw, accw) = (f64s(&x), f64s(&dy), f64s(&acc));
        let want_y: Vec<f64> = xw.iter().map(|&v| v * phi(v)).collect();
        let pdf = |v: f64| (-0.5 * v * v).exp() / (2.0 * PI).sqrt();
        // The accumulated gradient is compared as the gradient itself (dx - acc), so that
        // the bar applies to what the op computed, not to the starting values.
        let want_g: Vec<f64> = xw
            .iter()
            .zip(&dyw)
            .map(|(&v, &d)| d * (phi(v) + v * pdf(v)))
            .collect();
        let grad =
            |dx: &[E]| -> Vec<f64> { f64s(dx).iter().zip(&accw).map(|(a, b)| a - b).collect() };
        let case = format!("{} N={len}", E::DTYPE);
        let e = rel_l2(&f64s(&nr.0), &want_y);
        assert!(
            e <= tol.forward,
            "{case}: y rel L2 {e:e} vs f64 > {}",
            tol.forward
        );
        // For bf16, dx - acc carries dx's storage rounding at acc's magnitude (~2^-9 |acc|
        // per element, acc ~ the gradient's size): inside the 0.04 gradient bar.
        let e = rel_l2(&grad(&nr.1), &want_g);
        assert!(
            e <= tol.grad,
            "{case}: dx rel L2 {e:e} vs f64 > {}",
            tol.grad
        );
        let bf = E::DTYPE == DType::BF16;
        let e = rel_l2(&f64s(&nr.0), &f64s(&cr.0));
        assert!(
            e <= crate::bar(cpu_tol, bf),
            "{case}: y rel L2 {e:e} vs the CPU"
        );
        let e = rel_l2(&f64s(&nr.1), &f64s(&cr.1));
        assert!(
            e <= crate::bar(cpu_tol, bf),
            "{case}: dx rel L2 {e:e} vs the CPU"
        );
    }
}

#[test]
fn gelu_matches_the_f64_reference_and_the_cpu() {
    // The emulator runs the CPU kernel on the same inputs. f32: y is the CPU's; dx differs
    // by the rounding of the op's written gradient before the add (~1e-7 relative). bf16: that
    // gradient is rounded to bf16 and the sum again (the CPU rounds once), so a part of the
    // elements differ by one bf16 ulp (2^-8 relative): rel L2 ~1e-3, bar 4e-3 as for the
    // other ops' bf16 comparisons.
    gelu::<f32>(|v| v.to_vec(), Tolerances::F32, 1e-6);
    gelu::<bf16>(bf, Tolerances::BF16, 4e-3);
}
