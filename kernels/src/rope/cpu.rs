//! CPU RoPE: rayon over blocks of tokens; per (token, head) one vectorised loop over the D/2
//! rotation pairs.

use super::RopeTable;
use crate::cast::simd::{self, Simd, WithSimd};
use cannon_runtime::Float;
use rayon::prelude::*;

/// Rotates every head of every token by its slot's angles; `sign` -1 rotates backwards.
pub(super) fn rotate<E: Float>(
    x: &mut [E],
    n_heads: usize,
    table: &RopeTable,
    pos: &[u32],
    sign: f32,
) {
    let row = n_heads * table.head_dim();
    if row == 0 {
        return;
    }
    let tpt = (16_384 / row).max(1); // tokens per rayon task
    x.par_chunks_mut(tpt * row)
        .zip(pos.par_chunks(tpt))
        .for_each(|(x, pos)| {
            simd::run(Rotate {
                x,
                table,
                pos,
                row,
                sign,
            })
        });
}

struct Rotate<'a, E> {
    x: &'a mut [E],
    table: &'a RopeTable,
    pos: &'a [u32],
    row: usize,
    sign: f32,
}

impl<E: Float> WithSimd for Rotate<'_, E> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let d = self.table.head_dim();
        let half = d / 2;
        for (xt, &p) in self.x.chunks_exact_mut(self.row).zip(self.pos) {
            // Slots were checked against the table by the caller.
            let (cos, sin) = (
                self.table.cos_row(p as usize),
                self.table.sin_row(p as usize),
            );
            for head in xt.chunks_exact_mut(d) {
                let (x1, x2) = head.split_at_mut(half);
                for (((a, b), &c), &s) in x1.iter_mut().zip(x2.iter_mut()).zip(cos).zip(sin) {
                    let (u, v, s) = (a.to_f32(), b.to_f32(), self.sign * s);
                    *a = E::from_f32(u * c - v * s);
                    *b = E::from_f32(v * c + u * s);
                }
            }
        }
    }
}
