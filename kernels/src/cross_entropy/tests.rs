use super::host::{cross_entropy, cross_entropy_chunked, cross_entropy_in_place};
use super::*;
use crate::cast::check::{assert_close, fd_grad};
use crate::testutil::{rel_l2, Rng};

/// Naive f64 softmax cross-entropy: p = exp(x) / sum exp(x) directly (no max shift; the test
/// logits are small), loss = -ln p[label], grad = (p - onehot) / divisor.
fn reference(logits: &[f64], labels: &[i32], v: usize, div: Option<f64>) -> (f64, Vec<f64>) {
    let count = labels.iter().filter(|&&l| l != IGNORE_INDEX).count();
    let div = div.unwrap_or(count as f64);
    let mut grad = vec![0.0; logits.len()];
    let mut loss = 0.0;
    for (n, &l) in labels.iter().enumerate() {
        if l == IGNORE_INDEX {
            continue;
        }
        let x = &logits[n * v..][..v];
        let z: f64 = x.iter().map(|a| a.exp()).sum();
        loss -= (x[l as usize].exp() / z).ln();
        for j in 0..v {
            let onehot = if j == l as usize { 1.0 } else { 0.0 };
            grad[n * v + j] = (x[j].exp() / z - onehot) / div;
        }
    }
    (loss / div, grad)
}

/// Random logits (scale 3) and labels with about a quarter ignored.
fn case(rng: &mut Rng, n: usize, v: usize) -> (Vec<f32>, Vec<i32>) {
    let logits = rng.normal_vec(n * v, 3.0);
    let labels = (0..n)
        .map(|_| {
            if rng.below(4) == 0 {
                IGNORE_INDEX
            } else {
                rng.below(v) as i32
            }
        })
        .collect();
    (logits, labels)
}

fn wide(a: &[f32]) -> Vec<f64> {
    crate::testutil::to_f64(a)
}

/// (N, V): one row, one class, odd vocabularies around the 16-lane width, and enough rows
/// for several rayon tasks.
const SHAPES: [(usize, usize); 7] = [
    (1, 1),
    (1, 7),
    (3, 16),
    (5, 17),
    (9, 100),
    (33, 1001),
    (70, 300),
];

#[test]
fn full_matches_f64_reference() {
    let mut rng = Rng::new(40);
    for &(n, v) in &SHAPES {
        let (logits, labels) = case(&mut rng, n, v);
        for norm in [LossNorm::Mean, LossNorm::Divisor(7.5)] {
            let div = match norm {
                LossNorm::Divisor(d) => Some(d),
                LossNorm::Mean => None,
            };
            let (rl, rg) = reference(&wide(&logits), &labels, v, div);
            if div.is_none() && labels.iter().all(|&l| l == IGNORE_INDEX) {
                continue; // covered by all_ignored_gives_zero_without_nan
            }
            let mut grad = vec![f32::NAN; n * v];
            let st = cross_entropy(&logits, &labels, v, Some(&mut grad), norm).unwrap();
            let what = format!("N={n} V={v} {norm:?}");
            // Loss: a sum of N terms each within a few f32 ulp of exact: 1e-5 relative.
            assert!(
                (st.loss - rl).abs() <= 1e-5 * rl.abs().max(1e-3),
                "{what}: {} vs {rl}",
                st.loss
            );
            assert_close(&format!("{what} d_logits"), &grad, &rg, 1e-4);
            assert_eq!(
                st.count,
                labels.iter().filter(|&&l| l != IGNORE_INDEX).count()
            );
            assert!((st.sum / div.unwrap_or(st.count as f64) - st.loss).abs() < 1e-12);

            // Loss only, and in place: the same numbers.
            let st2 = cross_entropy(&logits, &labels, v, None, norm).unwrap();
            assert_eq!(
                st2.loss.to_bits(),
                st.loss.to_bits(),
                "{what}: loss-only path"
            );
            let mut inplace = logits.clone();
            let st3 = cross_entropy_in_place(&mut inplace, &labels, v, norm).unwrap();
            assert_eq!(st3, st, "{what}: in-place stats");
            assert_eq!(inplace, grad, "{what}: in-place gradient");
        }
    }
}

#[test]
fn gradient_matches_finite_differences() {
    // FD of the f64 reference loss validates its gradient, and the f32 kernel against it.
    let mut rng = Rng::new(41);
    let (n, v) = (3, 5);
    let (logits, mut labels) = case(&mut rng, n, v);
    labels[0] = 2;
    let x = wide(&logits);
    let fd = fd_grad(&x, 1e-5, |x| reference(x, &labels, v, None).0);
    let (_, rg) = reference(&x, &labels, v, None);
    assert!(
        rel_l2(&rg, &fd) < 1e-8,
        "reference vs FD {}",
        rel_l2(&rg, &fd)
    );
    let mut grad = vec![0.0f32; n * v];
    cross_entropy(&logits, &labels, v, Some(&mut grad), LossNorm::Mean).unwrap();
    assert_close("kernel vs FD", &grad, &fd, 1e-4);
}

#[test]
fn all_ignored_gives_zero_without_nan() {
    let (n, v) = (4, 10);
    let logits = Rng::new(42).normal_vec(n * v, 1.0);
    let labels = vec![IGNORE_INDEX; n];
    let mut grad = vec![f32::NAN; n * v];
    let st = cross_entropy(&logits, &labels, v, Some(&mut grad), LossNorm::Mean).unwrap();
    assert_eq!(
        st,
        CeStats {
            loss: 0.0,
            sum: 0.0,
            count: 0
        }
    );
    assert!(grad.iter().all(|&g| g == 0.0));
    let mut inplace = logits.clone();
    cross_entropy_in_place(&mut inplace, &labels, v, LossNorm::Mean).unwrap();
    assert!(inplace.iter().all(|&g| g == 0.0));
    // With a caller's divisor (other micro-batches had labels) it is 0 as well, not NaN.
    let st = cross_entropy(&logits, &labels, v, Some(&mut grad), LossNorm::Divisor(3.0)).unwrap();
    assert_eq!(st.loss, 0.0);
    assert!(grad.iter().all(|&g| g == 0.0));
    // And an empty batch.
    let st = cross_entropy(&[], &[], v, None, LossNorm::Mean).unwrap();
    assert_eq!(st.loss, 0.0);
}

#[test]
fn large_logits_do_not_overflow() {
    // The max shift keeps exp in range: logits ~ +-1e4 give finite loss and gradient.
    let v = 50;
    let mut logits: Vec<f32> = (0..v).map(|j| j as f32 * 200.0 - 5000.0).collect();
    logits[7] = 9000.0;
    let mut grad = vec![0.0f32; v];
    let st = cross_entropy(&logits, &[3], v, Some(&mut grad), LossNorm::Mean).unwrap();
    // -log softmax at 3: lse ~ 9000 (the max dominates), so loss = 9000 - (3*200 - 5000).
    assert!(
        (st.loss - (9000.0 - (600.0 - 5000.0))).abs() < 1e-3,
        "{}",
        st.loss
    );
    assert!((grad[7] - 1.0).abs() < 1e-6 && (grad[3] + 1.0).abs() < 1e-6);
}

#[test]
fn bad_labels_and_divisors_are_errors() {
    let logits = vec![0.0f32; 6];
    let e = cross_entropy(&logits, &[1, 3], 3, None, LossNorm::Mean).unwrap_err();
    assert!(
        e.to_string()
            .contains("label 3 at row 1 is neither -100 nor in 0..3"),
        "{e}"
    );
    let e = cross_entropy(&logits, &[1, -1], 3, None, LossNorm::Mean).unwrap_err();
    assert!(e.to_string().contains("label -1 at row 1"), "{e}");
    let e = cross_entropy(&logits, &[1, 2], 3, None, LossNorm::Divisor(0.0)).unwrap_err();
    assert!(e.to_string().contains("divisor must be positive"), "{e}");
    let e = cross_entropy(&logits, &[1, 2, 0], 3, None, LossNorm::Mean).unwrap_err();
    assert!(
        e.to_string().contains("logits has 6 elements, expected 9"),
        "{e}"
    );
}

/// A chunk producer for the tests: logits = h W^T computed naively per row (f32 products,
/// f64 sums), gradient consumed as dh = dl W and dW = dl^T h (f64), exactly what the trainer
/// plugs in with the lm_head GEMM. Records the largest chunk it was asked for.
struct NaiveHead<'a> {
    h: &'a [f32], // [N, D]
    w: &'a [f32], // [V, D]
    d: usize,
    v: usize,
    dh: Vec<f64>, // [N, D]
    dw: Vec<f64>, // [V, D]
    max_rows: usize,
    calls: usize,
}

impl NaiveHead<'_> {
    fn row_logits(&self, n: usize, out: &mut [f32]) {
        for (j, o) in out.iter_mut().enumerate() {
            let (hr, wr) = (
                &self.h[n * self.d..][..self.d],
                &self.w[j * self.d..][..self.d],
            );
            *o = hr
                .iter()
                .zip(wr)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>() as f32;
        }
    }
}

impl ChunkedLogits for NaiveHead<'_> {
    type Error = KernelError;
    fn logits(&mut self, rows: Range<usize>, out: &mut [f32]) -> Result<()> {
        assert_eq!(out.len(), rows.len() * self.v);
        self.max_rows = self.max_rows.max(rows.len());
        self.calls += 1;
        for (i, n) in rows.enumerate() {
            self.row_logits(n, &mut out[i * self.v..][..self.v]);
        }
        Ok(())
    }
    fn backward(&mut self, rows: Range<usize>, dl: &[f32]) -> Result<()> {
        let (d, v) = (self.d, self.v);
        for (i, n) in rows.enumerate() {
            for j in 0..v {
                let g = dl[i * v + j] as f64;
                for k in 0..d {
                    self.dh[n * d + k] += g * self.w[j * d + k] as f64;
                    self.dw[j * d + k] += g * self.h[n * d + k] as f64;
                }
            }
        }
        Ok(())
    }
}

#[test]
fn chunked_equals_full() {
    let mut rng = Rng::new(43);
    for &(n, d, v, chunk) in &[
        (1usize, 3usize, 5usize, 1usize),
        (37, 8, 129, 5),
        (64, 4, 33, 64),
        (10, 6, 17, 100),
    ] {
        let h = rng.normal_vec(n * d, 1.0);
        let w = rng.normal_vec(v * d, 0.5);
        let mut labels: Vec<i32> = (0..n).map(|_| rng.below(v) as i32).collect();
        // An all-ignored first chunk (skipped) and scattered ignored rows.
        for l in labels.iter_mut().take(chunk.min(n - 1)) {
            *l = IGNORE_INDEX;
        }
        for i in (0..n).step_by(3) {
            labels[i] = IGNORE_INDEX;
        }
        if labels.iter().all(|&l| l == IGNORE_INDEX) {
            labels[n - 1] = 0;
        }
        let mut head = NaiveHead {
            h: &h,
            w: &w,
            d,
            v,
            dh: vec![0.0; n * d],
            dw: vec![0.0; v * d],
            max_rows: 0,
            calls: 0,
        };
        // Full path: all logits, their gradient, then the same consumer.
        let mut logits = vec![0.0f32; n * v];
        head.logits(0..n, &mut logits).unwrap();
        let mut grad = vec![0.0f32; n * v];
        let full = cross_entropy(&logits, &labels, v, Some(&mut grad), LossNorm::Mean).unwrap();
        head.backward(0..n, &grad).unwrap();
        let (full_dh, full_dw) = (std::mem::take(&mut head.dh), std::mem::take(&mut head.dw));
        head.dh = vec![0.0; n * d];
        head.dw = vec![0.0; v * d];
        head.max_rows = 0;
        head.calls = 0;

        let st = cross_entropy_chunked(&mut head, &labels, v, chunk, LossNorm::Mean, true).unwrap();
        let what = format!("N={n} D={d} V={v} chunk={chunk}");
        assert!(
            (st.loss - full.loss).abs() <= 1e-6 * full.loss.abs(),
            "{what}: {} vs {}",
            st.loss,
            full.loss
        );
        assert_eq!(st.count, full.count);
        assert!(
            head.max_rows <= chunk,
            "{what}: asked for {} rows",
            head.max_rows
        );
        let skipped = n.div_ceil(chunk) - head.calls;
        assert_eq!(
            skipped > 0,
            chunk < n,
            "{what}: the all-ignored first chunk is skipped"
        );
        assert!(
            rel_l2(&head.dh, &full_dh) <= 1e-6,
            "{what}: dh {}",
            rel_l2(&head.dh, &full_dh)
        );
        assert!(
            rel_l2(&head.dw, &full_dw) <= 1e-6,
            "{what}: dW {}",
            rel_l2(&head.dw, &full_dw)
        );

        // Loss only: no backward calls, same loss; and a caller's divisor.
        head.dh.fill(0.0);
        let st =
            cross_entropy_chunked(&mut head, &labels, v, chunk, LossNorm::Mean, false).unwrap();
        assert!((st.loss - full.loss).abs() <= 1e-6 * full.loss.abs());
        assert!(head.dh.iter().all(|&g| g == 0.0));
        let st =
            cross_entropy_chunked(&mut head, &labels, v, chunk, LossNorm::Divisor(11.0), false)
                .unwrap();
        assert!((st.loss - full.sum / 11.0).abs() <= 1e-6 * st.loss.abs());
    }
}

#[test]
fn chunked_all_ignored_calls_nothing() {
    let (h, w) = (vec![1.0f32; 6], vec![1.0f32; 9]);
    let mut head = NaiveHead {
        h: &h,
        w: &w,
        d: 3,
        v: 3,
        dh: vec![0.0; 6],
        dw: vec![0.0; 9],
        max_rows: 0,
        calls: 0,
    };
    let st =
        cross_entropy_chunked(&mut head, &[IGNORE_INDEX; 2], 3, 1, LossNorm::Mean, true).unwrap();
    assert_eq!((st.loss, st.count, head.calls), (0.0, 0, 0));
    let e = cross_entropy_chunked(&mut head, &[0, 1], 3, 0, LossNorm::Mean, true).unwrap_err();
    assert!(e.to_string().contains("chunk_rows is 0"), "{e}");
}
