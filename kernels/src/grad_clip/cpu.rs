//! CPU pieces of clipping: a chunked f64 sum of squares and an f32 scale, both rayon-parallel.

use crate::cast::simd::{self, Simd, WithSimd, PAR_CHUNK};
use rayon::prelude::*;

/// f64 lanes: one AVX-512 register of doubles.
const LANES64: usize = 8;

/// sum g^2 in f64: per-chunk partials (fixed chunks), then added in chunk order.
pub(super) fn sum_squares(g: &[f32]) -> f64 {
    let partial: Vec<f64> = g
        .par_chunks(PAR_CHUNK)
        .map(|c| simd::run(SumSquares(c)))
        .collect();
    partial.iter().fold(0.0, |s, &p| s + p)
}

struct SumSquares<'a>(&'a [f32]);

impl WithSimd for SumSquares<'_> {
    type Output = f64;
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) -> f64 {
        let mut acc = [0.0f64; LANES64];
        let mut it = self.0.chunks_exact(LANES64);
        for c in &mut it {
            for i in 0..LANES64 {
                let x = c[i] as f64;
                acc[i] += x * x;
            }
        }
        let mut s = acc.iter().sum::<f64>();
        for &x in it.remainder() {
            s += x as f64 * x as f64;
        }
        s
    }
}

pub(super) fn scale(g: &mut [f32], coef: f32) {
    g.par_chunks_mut(PAR_CHUNK)
        .for_each(|c| simd::run(Scale(c, coef)));
}

struct Scale<'a>(&'a mut [f32], f32);

impl WithSimd for Scale<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        for x in self.0.iter_mut() {
            *x *= self.1;
        }
    }
}
