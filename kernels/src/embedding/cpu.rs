//! CPU embedding: parallel row copies forward; backward grouped by id (a counting sort of the
//! tokens), so every dW row is written by exactly one task, in token order.

use crate::cast::simd::{self, Simd, WithSimd};
use cannon_runtime::Float;
use rayon::prelude::*;

pub(super) fn forward<E: Float>(out: &mut [E], ids: &[u32], w: &[E], dim: usize) {
    out.par_chunks_mut(dim)
        .zip(ids.par_iter())
        .with_min_len(64)
        .for_each(|(o, &id)| {
            o.copy_from_slice(&w[id as usize * dim..][..dim]);
        });
}

pub(super) fn backward<E: Float>(
    dw: &mut [f32],
    dout: &[E],
    ids: &[u32],
    vocab: usize,
    dim: usize,
) {
    // start[v]..start[v + 1] indexes `order`, the tokens of id v in increasing t.
    let mut start = vec![0u32; vocab + 1];
    for &id in ids {
        start[id as usize + 1] += 1;
    }
    for v in 0..vocab {
        start[v + 1] += start[v];
    }
    let mut fill = start.clone();
    let mut order = vec![0u32; ids.len()];
    for (t, &id) in ids.iter().enumerate() {
        order[fill[id as usize] as usize] = t as u32;
        fill[id as usize] += 1;
    }
    dw.par_chunks_mut(dim)
        .enumerate()
        .with_min_len(256)
        .for_each(|(v, row)| {
            let tokens = &order[start[v] as usize..start[v + 1] as usize];
            for &t in tokens {
                simd::run(AddRow {
                    dst: row,
                    src: &dout[t as usize * dim..][..dim],
                });
            }
        });
}

struct AddRow<'a, E> {
    dst: &'a mut [f32],
    src: &'a [E],
}

impl<E: Float> WithSimd for AddRow<'_, E> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        for (d, s) in self.dst.iter_mut().zip(self.src) {
            *d += s.to_f32();
        }
    }
}
