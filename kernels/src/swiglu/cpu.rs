//! CPU SwiGLU: rayon over fixed chunks, each one vectorised loop (exp from `cast::simd`).

use crate::cast::round_to;
use crate::cast::simd::{self, Simd, WithSimd, PAR_CHUNK};
use cannon_runtime::Float;
use rayon::prelude::*;

#[inline(always)]
fn sigmoid(g: f32) -> f32 {
    1.0 / (1.0 + simd::exp(-g))
}

pub(super) fn forward<E: Float>(h: &mut [E], gate: &[E], up: &[E]) {
    h.par_chunks_mut(PAR_CHUNK)
        .zip(gate.par_chunks(PAR_CHUNK))
        .zip(up.par_chunks(PAR_CHUNK))
        .for_each(|((h, gate), up)| simd::run(Forward { h, gate, up }));
}

struct Forward<'a, E> {
    h: &'a mut [E],
    gate: &'a [E],
    up: &'a [E],
}

impl<E: Float> WithSimd for Forward<'_, E> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        for ((h, &g), &u) in self.h.iter_mut().zip(self.gate).zip(self.up) {
            let g = g.to_f32();
            *h = E::from_f32(round_to::<E>(g * sigmoid(g)) * u.to_f32());
        }
    }
}

pub(super) fn backward<E: Float>(d_gate: &mut [E], d_up: &mut [E], dh: &[E], gate: &[E], up: &[E]) {
    d_gate
        .par_chunks_mut(PAR_CHUNK)
        .zip(d_up.par_chunks_mut(PAR_CHUNK))
        .zip(dh.par_chunks(PAR_CHUNK))
        .zip(gate.par_chunks(PAR_CHUNK))
        .zip(up.par_chunks(PAR_CHUNK))
        .for_each(|((((d_gate, d_up), dh), gate), up)| {
            simd::run(Backward {
                d_gate,
                d_up,
                dh,
                gate,
                up,
            })
        });
}

struct Backward<'a, E> {
    d_gate: &'a mut [E],
    d_up: &'a mut [E],
    dh: &'a [E],
    gate: &'a [E],
    up: &'a [E],
}

impl<E: Float> WithSimd for Backward<'_, E> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let it = self.d_gate.iter_mut().zip(self.d_up.iter_mut());
        for ((((dg, du), &dh), &g), &u) in it.zip(self.dh).zip(self.gate).zip(self.up) {
            let (dh, g) = (dh.to_f32(), g.to_f32());
            let s = sigmoid(g);
            *dg = E::from_f32(dg.to_f32() + dh * u.to_f32() * s * (1.0 + g * (1.0 - s)));
            *du = E::from_f32(du.to_f32() + dh * round_to::<E>(g * s));
        }
    }
}
