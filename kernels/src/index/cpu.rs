//! CPU row gathers/scatters and the batched transpose. Gathers and transposes write disjoint
//! output rows and run in parallel; scatters follow the index order on one thread (repeated
//! indices must sum, or overwrite, in that order).

use super::TransposeDims;
use cannon_runtime::Element;
use cannon_runtime::Float;
use rayon::prelude::*;

/// Rows per rayon task: copies are memory-bound, so tasks only need to be large enough to
/// amortise the scheduling.
const ROWS_PER_TASK: usize = 64;

pub(super) fn gather_rows<T: Element>(out: &mut [T], src: &[T], idx: &[usize], dim: usize) {
    out.par_chunks_mut(dim * ROWS_PER_TASK)
        .zip(idx.par_chunks(ROWS_PER_TASK))
        .for_each(|(out, idx)| {
            for (row, &r) in out.chunks_exact_mut(dim).zip(idx) {
                row.copy_from_slice(&src[r * dim..(r + 1) * dim]);
            }
        });
}

pub(super) fn scatter_rows<T: Element>(dst: &mut [T], src: &[T], idx: &[usize], dim: usize) {
    for (row, &r) in src.chunks_exact(dim).zip(idx) {
        dst[r * dim..(r + 1) * dim].copy_from_slice(row);
    }
}

pub(super) fn scatter_add_rows<E: Float>(dst: &mut [E], src: &[E], idx: &[usize], dim: usize) {
    for (row, &r) in src.chunks_exact(dim).zip(idx) {
        for (d, &s) in dst[r * dim..(r + 1) * dim].iter_mut().zip(row) {
            *d = E::from_f32(d.to_f32() + s.to_f32());
        }
    }
}

pub(super) fn transpose<T: Element>(out: &mut [T], x: &[T], d: TransposeDims) {
    let m = d.rows * d.cols;
    if m == 0 {
        return;
    }
    out.par_chunks_mut(m)
        .zip(x.par_chunks(m))
        .for_each(|(out, x)| {
            for (c, col) in out.chunks_exact_mut(d.rows).enumerate() {
                for (r, o) in col.iter_mut().enumerate() {
                    *o = x[r * d.cols + c];
                }
            }
        });
}
