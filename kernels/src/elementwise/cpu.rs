//! CPU elementwise ops: rayon over fixed chunks, one loop each compiled for the CPU's widest
//! SIMD (see `cast::simd`). For f32, `to_f32`/`from_f32` are the identity and the loops are
//! the plain `y += x` / `a * b`.

use crate::cast::simd::{self, Simd, WithSimd, PAR_CHUNK};
use cannon_runtime::Float;
use rayon::prelude::*;

/// `y[i] = y[i] OP x[i]` in f32, rounded once to E.
macro_rules! in_place {
    ($name:ident, $kernel:ident, $op:tt) => {
        struct $kernel<'a, E> {
            y: &'a mut [E],
            x: &'a [E],
        }

        impl<E: Float> WithSimd for $kernel<'_, E> {
            type Output = ();
            #[inline(always)]
            fn with_simd<S: Simd>(self, _: S) {
                for (y, &x) in self.y.iter_mut().zip(self.x) {
                    *y = E::from_f32(y.to_f32() $op x.to_f32());
                }
            }
        }

        pub(super) fn $name<E: Float>(y: &mut [E], x: &[E]) {
            y.par_chunks_mut(PAR_CHUNK)
                .zip(x.par_chunks(PAR_CHUNK))
                .for_each(|(y, x)| simd::run($kernel { y, x }));
        }
    };
}

in_place!(add_into, AddInto, +);
in_place!(mul_into, MulInto, *);

struct Mul<'a, E> {
    out: &'a mut [E],
    a: &'a [E],
    b: &'a [E],
}

impl<E: Float> WithSimd for Mul<'_, E> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        for ((o, &a), &b) in self.out.iter_mut().zip(self.a).zip(self.b) {
            *o = E::from_f32(a.to_f32() * b.to_f32());
        }
    }
}

pub(super) fn mul<E: Float>(out: &mut [E], a: &[E], b: &[E]) {
    out.par_chunks_mut(PAR_CHUNK)
        .zip(a.par_chunks(PAR_CHUNK))
        .zip(b.par_chunks(PAR_CHUNK))
        .for_each(|((out, a), b)| simd::run(Mul { out, a, b }));
}
