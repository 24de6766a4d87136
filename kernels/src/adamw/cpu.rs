//! CPU AdamW: rayon over fixed chunks of the four streams, one vectorised loop each.

use super::StepScalars;
use crate::cast::simd::{self, Simd, WithSimd, PAR_CHUNK};
use rayon::prelude::*;

pub(super) fn step(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], s: &StepScalars) {
    p.par_chunks_mut(PAR_CHUNK)
        .zip(g.par_chunks(PAR_CHUNK))
        .zip(m.par_chunks_mut(PAR_CHUNK))
        .zip(v.par_chunks_mut(PAR_CHUNK))
        .for_each(|(((p, g), m), v)| simd::run(Step { p, g, m, v, s: *s }));
}

struct Step<'a> {
    p: &'a mut [f32],
    g: &'a [f32],
    m: &'a mut [f32],
    v: &'a mut [f32],
    s: StepScalars,
}

impl WithSimd for Step<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let s = self.s;
        let it = self
            .p
            .iter_mut()
            .zip(self.g)
            .zip(self.m.iter_mut())
            .zip(self.v.iter_mut());
        for (((p, &g), m), v) in it {
            let pd = *p * s.decay;
            let mm = *m + s.one_minus_b1 * (g - *m);
            let vv = *v * s.b2 + s.one_minus_b2 * g * g;
            let denom = vv.sqrt() / s.bc2_sqrt + s.eps;
            *p = pd + s.neg_step_size * mm / denom;
            *m = mm;
            *v = vv;
        }
    }
}
