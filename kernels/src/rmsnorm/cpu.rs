//! CPU RMSNorm: rayon over blocks of rows, one vectorised pass per row (two in the backward).

use crate::cast::round_to;
use crate::cast::simd::{self, hsum, Simd, WithSimd, LANES};
use cannon_runtime::Float;
use rayon::prelude::*;

/// Rows per rayon task: about 16K elements, so a task is some microseconds of work.
fn rows_per_task(dim: usize) -> usize {
    (16_384 / dim).max(1)
}

pub(super) fn forward<E: Float>(
    out: &mut [E],
    rstd: &mut [f32],
    x: &[E],
    w: &[E],
    dim: usize,
    eps: f32,
) {
    let rpt = rows_per_task(dim);
    out.par_chunks_mut(rpt * dim)
        .zip(rstd.par_chunks_mut(rpt))
        .zip(x.par_chunks(rpt * dim))
        .for_each(|((out, rstd), x)| {
            simd::run(Forward {
                out,
                rstd,
                x,
                w,
                dim,
                eps,
            })
        });
}

struct Forward<'a, E> {
    out: &'a mut [E],
    rstd: &'a mut [f32],
    x: &'a [E],
    w: &'a [E],
    dim: usize,
    eps: f32,
}

impl<E: Float> WithSimd for Forward<'_, E> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let d = self.dim;
        for ((out, r), x) in self
            .out
            .chunks_exact_mut(d)
            .zip(self.rstd.iter_mut())
            .zip(self.x.chunks_exact(d))
        {
            let rs = 1.0 / (sum_squares(x) / d as f32 + self.eps).sqrt();
            *r = rs;
            for ((o, &xi), &wi) in out.iter_mut().zip(x).zip(self.w) {
                *o = E::from_f32(wi.to_f32() * round_to::<E>(xi.to_f32() * rs));
            }
        }
    }
}

#[inline(always)]
fn sum_squares<E: Float>(x: &[E]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut it = x.chunks_exact(LANES);
    for c in &mut it {
        for i in 0..LANES {
            let v = c[i].to_f32();
            acc[i] += v * v;
        }
    }
    let mut s = hsum(acc);
    for v in it.remainder() {
        s += v.to_f32() * v.to_f32();
    }
    s
}

/// Rows per dw partial: at most 64 partials (bounded memory for big T x D), at least a task's
/// worth of rows. Depends on (T, D) only, so the dw summation order is fixed.
fn rows_per_block(t: usize, dim: usize) -> usize {
    t.div_ceil(64).max(rows_per_task(dim)).max(1)
}

/// Columns per rayon task when summing the dw partials.
const DW_COLS: usize = 1024;

pub(super) fn backward<E: Float>(
    dx: &mut [E],
    dw: &mut [f32],
    dout: &[E],
    x: &[E],
    w: &[E],
    rstd: &[f32],
    dim: usize,
) {
    let t = rstd.len();
    if t == 0 {
        return;
    }
    let rpb = rows_per_block(t, dim);
    let blocks = t.div_ceil(rpb);
    // [blocks, D]: each block's sum over its rows of dout * n, summed into dw in block order.
    let mut partial = vec![0.0f32; blocks * dim];
    partial
        .par_chunks_mut(dim)
        .zip(dx.par_chunks_mut(rpb * dim))
        .zip(dout.par_chunks(rpb * dim))
        .zip(x.par_chunks(rpb * dim))
        .zip(rstd.par_chunks(rpb))
        .for_each(|((((dw, dx), dout), x), rstd)| {
            simd::run(Backward {
                dx,
                dw,
                dout,
                x,
                w,
                rstd,
                dim,
            })
        });
    dw.par_chunks_mut(DW_COLS).enumerate().for_each(|(c, dw)| {
        let c0 = c * DW_COLS;
        for b in 0..blocks {
            let p = &partial[b * dim + c0..][..dw.len()];
            simd::run(AddAssign { dst: dw, src: p });
        }
    });
}

struct Backward<'a, E> {
    dx: &'a mut [E],
    dw: &'a mut [f32],
    dout: &'a [E],
    x: &'a [E],
    w: &'a [E],
    rstd: &'a [f32],
    dim: usize,
}

impl<E: Float> WithSimd for Backward<'_, E> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let d = self.dim;
        let inv_d = 1.0 / d as f32;
        for (((dx, dy), x), &r) in self
            .dx
            .chunks_exact_mut(d)
            .zip(self.dout.chunks_exact(d))
            .zip(self.x.chunks_exact(d))
            .zip(self.rstd)
        {
            // mean_k (dout w)[k] * xh[k], with xh = x * r: r factored out of the sum.
            let mut acc = [0.0f32; LANES];
            let (mut cy, mut cx, mut cw) = (
                dy.chunks_exact(LANES),
                x.chunks_exact(LANES),
                self.w.chunks_exact(LANES),
            );
            for ((y, x), w) in (&mut cy).zip(&mut cx).zip(&mut cw) {
                for i in 0..LANES {
                    acc[i] += y[i].to_f32() * w[i].to_f32() * x[i].to_f32();
                }
            }
            let mut s = hsum(acc);
            for ((y, x), w) in cy
                .remainder()
                .iter()
                .zip(cx.remainder())
                .zip(cw.remainder())
            {
                s += y.to_f32() * w.to_f32() * x.to_f32();
            }
            let c = s * r * inv_d;
            for ((((dxj, &dyj), &xj), &wj), dwj) in dx
                .iter_mut()
                .zip(dy)
                .zip(x)
                .zip(self.w)
                .zip(self.dw.iter_mut())
            {
                let (dyj, xh) = (dyj.to_f32(), xj.to_f32() * r);
                *dxj = E::from_f32(dxj.to_f32() + r * (dyj * wj.to_f32() - xh * c));
                *dwj += dyj * round_to::<E>(xh);
            }
        }
    }
}

struct AddAssign<'a> {
    dst: &'a mut [f32],
    src: &'a [f32],
}

impl WithSimd for AddAssign<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        for (d, s) in self.dst.iter_mut().zip(self.src) {
            *d += s;
        }
    }
}
