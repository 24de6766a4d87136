//! CPU casts: rayon over fixed-size chunks, each chunk one vectorised loop.

use super::simd::{self, Simd, WithSimd, PAR_CHUNK};
use cannon_runtime::Float;
use rayon::prelude::*;

/// `dst[i] = B::from_f32(src[i].to_f32())`; lengths already checked equal.
pub(super) fn convert<A: Float, B: Float>(src: &[A], dst: &mut [B]) {
    dst.par_chunks_mut(PAR_CHUNK)
        .zip(src.par_chunks(PAR_CHUNK))
        .for_each(|(d, s)| simd::run(Convert { src: s, dst: d }));
}

struct Convert<'a, A, B> {
    src: &'a [A],
    dst: &'a mut [B],
}

impl<A: Float, B: Float> WithSimd for Convert<'_, A, B> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        for (d, &s) in self.dst.iter_mut().zip(self.src) {
            *d = B::from_f32(s.to_f32());
        }
    }
}
