//! CPU cross-entropy: rayon over rows; per row three vectorised passes (max, exp + sum with
//! the exponentials stored as the gradient's first draft, scale) over data that stays in L2.

use super::IGNORE_INDEX;
use crate::cast::simd::{self, hsum, Simd, WithSimd, LANES};
use rayon::prelude::*;

/// Rows per rayon task: about 16K logits, so small vocabularies still make sizable tasks.
fn rows_per_task(vocab: usize) -> usize {
    (16_384 / vocab).max(1)
}

/// Sum in index order (the order both the full and the chunked path use).
pub(super) fn ordered_sum(losses: &[f64]) -> f64 {
    losses.iter().fold(0.0, |s, &l| s + l)
}

/// Per-row losses of `logits` [N, V] into `losses` [N]; with `grad` [N, V], the gradient.
pub(super) fn rows(
    logits: &[f32],
    grad: Option<&mut [f32]>,
    labels: &[i32],
    losses: &mut [f64],
    vocab: usize,
    scale: f32,
) {
    let rpt = rows_per_task(vocab);
    let it = logits
        .par_chunks(rpt * vocab)
        .zip(labels.par_chunks(rpt))
        .zip(losses.par_chunks_mut(rpt));
    match grad {
        Some(grad) => it.zip(grad.par_chunks_mut(rpt * vocab)).for_each(
            |(((logits, labels), losses), grad)| {
                let k = Rows {
                    logits,
                    grad: Some(grad),
                    labels,
                    losses,
                    vocab,
                    scale,
                };
                simd::run(k)
            },
        ),
        None => it.for_each(|((logits, labels), losses)| {
            simd::run(Rows {
                logits,
                grad: None,
                labels,
                losses,
                vocab,
                scale,
            })
        }),
    }
}

/// As [`rows`] with the gradient written over the logits.
pub(super) fn rows_in_place(
    logits: &mut [f32],
    labels: &[i32],
    losses: &mut [f64],
    vocab: usize,
    scale: f32,
) {
    let rpt = rows_per_task(vocab);
    logits
        .par_chunks_mut(rpt * vocab)
        .zip(labels.par_chunks(rpt))
        .zip(losses.par_chunks_mut(rpt))
        .for_each(|((x, labels), losses)| {
            simd::run(RowsInPlace {
                x,
                labels,
                losses,
                vocab,
                scale,
            })
        });
}

struct Rows<'a> {
    logits: &'a [f32],
    grad: Option<&'a mut [f32]>,
    labels: &'a [i32],
    losses: &'a mut [f64],
    vocab: usize,
    scale: f32,
}

impl WithSimd for Rows<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let v = self.vocab;
        let mut grad = self.grad.map(|g| g.chunks_exact_mut(v));
        for ((x, &label), loss) in self
            .logits
            .chunks_exact(v)
            .zip(self.labels)
            .zip(self.losses)
        {
            let g = grad.as_mut().and_then(|g| g.next());
            if label == IGNORE_INDEX {
                *loss = 0.0;
                if let Some(g) = g {
                    g.fill(0.0);
                }
                continue;
            }
            let m = row_max(x);
            let s = match g {
                Some(g) => {
                    let s = exp_store(x, g, m);
                    finish_grad(g, label as usize, self.scale / s, self.scale);
                    s
                }
                None => exp_sum(x, m),
            };
            *loss = row_loss(m, s, x[label as usize]);
        }
    }
}

struct RowsInPlace<'a> {
    x: &'a mut [f32],
    labels: &'a [i32],
    losses: &'a mut [f64],
    vocab: usize,
    scale: f32,
}

impl WithSimd for RowsInPlace<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let v = self.vocab;
        for ((x, &label), loss) in self.x.chunks_exact_mut(v).zip(self.labels).zip(self.losses) {
            if label == IGNORE_INDEX {
                *loss = 0.0;
                x.fill(0.0);
                continue;
            }
            let m = row_max(x);
            let target = x[label as usize];
            let s = exp_in_place(x, m);
            finish_grad(x, label as usize, self.scale / s, self.scale);
            *loss = row_loss(m, s, target);
        }
    }
}

/// `m + ln s - x_label` in f64: the row's -log softmax at the label.
#[inline(always)]
fn row_loss(m: f32, s: f32, target: f32) -> f64 {
    m as f64 + (s as f64).ln() - target as f64
}

#[inline(always)]
fn row_max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut it = x.chunks_exact(LANES);
    for c in &mut it {
        for i in 0..LANES {
            acc[i] = if c[i] > acc[i] { c[i] } else { acc[i] };
        }
    }
    let mut m = acc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for &v in it.remainder() {
        m = m.max(v);
    }
    m
}

/// sum_j exp(x_j - m).
#[inline(always)]
fn exp_sum(x: &[f32], m: f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut it = x.chunks_exact(LANES);
    for c in &mut it {
        for i in 0..LANES {
            acc[i] += simd::exp(c[i] - m);
        }
    }
    let mut s = hsum(acc);
    for &v in it.remainder() {
        s += simd::exp(v - m);
    }
    s
}

/// g_j = exp(x_j - m); returns their sum.
#[inline(always)]
fn exp_store(x: &[f32], g: &mut [f32], m: f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut gi = g.chunks_exact_mut(LANES);
    let mut xi = x.chunks_exact(LANES);
    for (gc, xc) in (&mut gi).zip(&mut xi) {
        for i in 0..LANES {
            let e = simd::exp(xc[i] - m);
            gc[i] = e;
            acc[i] += e;
        }
    }
    let mut s = hsum(acc);
    for (g, &v) in gi.into_remainder().iter_mut().zip(xi.remainder()) {
        *g = simd::exp(v - m);
        s += *g;
    }
    s
}

/// x_j = exp(x_j - m); returns their sum.
#[inline(always)]
fn exp_in_place(x: &mut [f32], m: f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut it = x.chunks_exact_mut(LANES);
    for c in &mut it {
        for i in 0..LANES {
            c[i] = simd::exp(c[i] - m);
            acc[i] += c[i];
        }
    }
    let mut s = hsum(acc);
    for v in it.into_remainder() {
        *v = simd::exp(*v - m);
        s += *v;
    }
    s
}

/// g = g * (scale / s) - scale [at the label]: softmax minus one-hot, divided by the divisor.
#[inline(always)]
fn finish_grad(g: &mut [f32], label: usize, c: f32, scale: f32) {
    for v in g.iter_mut() {
        *v *= c;
    }
    g[label] -= scale;
}
