//! CPU GELU: rayon over fixed chunks, one branch-free vectorised loop each.

use crate::cast::simd::{self, Simd, WithSimd, PAR_CHUNK};
use cannon_runtime::Float;
use rayon::prelude::*;

const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// 1 / sqrt(2 pi)
const INV_SQRT_2PI: f32 = 0.398_942_3;

/// erfc(z) for z >= 0: Numerical Recipes' `erfcc`, t = 1 / (1 + z/2),
/// erfc(z) = t exp(-z^2 - 1.26551223 + t P(t)), relative error < 1.2e-7. `z2` = z^2, passed
/// in so the caller can form it with one rounding (x^2 / 2 rather than (x / sqrt 2)^2): its
/// absolute error becomes a relative error of the result.
#[inline(always)]
#[allow(clippy::excessive_precision)] // the coefficients as published
fn erfc_nonneg(z: f32, z2: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = -0.822_152_23 + t * 0.170_872_77;
    let p = 1.488_515_87 + t * p;
    let p = -1.135_203_98 + t * p;
    let p = 0.278_868_07 + t * p;
    let p = -0.186_288_06 + t * p;
    let p = 0.096_784_18 + t * p;
    let p = 0.374_091_96 + t * p;
    let p = 1.000_023_68 + t * p;
    t * simd::exp(-z2 - 1.265_512_23 + t * p)
}

/// Phi(x) = erfc(-x / sqrt 2) / 2, using erfc(-z) = 2 - erfc(z) for x > 0.
#[inline(always)]
pub(super) fn phi_cdf(x: f32) -> f32 {
    let half_erfc = 0.5 * erfc_nonneg(x.abs() * FRAC_1_SQRT_2, 0.5 * x * x);
    if x > 0.0 {
        1.0 - half_erfc
    } else {
        half_erfc
    }
}

pub(super) fn forward<E: Float>(y: &mut [E], x: &[E]) {
    y.par_chunks_mut(PAR_CHUNK)
        .zip(x.par_chunks(PAR_CHUNK))
        .for_each(|(y, x)| simd::run(Forward { y, x }));
}

struct Forward<'a, E> {
    y: &'a mut [E],
    x: &'a [E],
}

impl<E: Float> WithSimd for Forward<'_, E> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        for (y, &x) in self.y.iter_mut().zip(self.x) {
            let x = x.to_f32();
            *y = E::from_f32(x * phi_cdf(x));
        }
    }
}

pub(super) fn backward<E: Float>(dx: &mut [E], dy: &[E], x: &[E]) {
    dx.par_chunks_mut(PAR_CHUNK)
        .zip(dy.par_chunks(PAR_CHUNK))
        .zip(x.par_chunks(PAR_CHUNK))
        .for_each(|((dx, dy), x)| simd::run(Backward { dx, dy, x }));
}

struct Backward<'a, E> {
    dx: &'a mut [E],
    dy: &'a [E],
    x: &'a [E],
}

impl<E: Float> WithSimd for Backward<'_, E> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        for ((dx, &dy), &x) in self.dx.iter_mut().zip(self.dy).zip(self.x) {
            let x = x.to_f32();
            let pdf = INV_SQRT_2PI * simd::exp(-0.5 * x * x);
            *dx = E::from_f32(dx.to_f32() + dy.to_f32() * (phi_cdf(x) + x * pdf));
        }
    }
}
