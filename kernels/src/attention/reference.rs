//! Test-only reference for the attention kernels: problem shapes, random data, a naive
//! float64 implementation (explicit S x S softmax per sequence and head, written for clarity,
//! its backward checked by finite differences in tests.rs), and runners of the kernel.

use super::cpu::{self, BwdSaved, BwdSchedule, Isa};
use super::{Qkv, QkvGrad, VarlenAttention};
use crate::testutil::{rel_l2, Rng};
use cannon_runtime::Float;
use half::bf16;

/// One attention problem: sequence lengths (cu_seqlens are their cumulative ends).
#[derive(Clone, Debug)]
pub(super) struct Case {
    pub(super) lens: Vec<usize>,
    pub(super) hq: usize,
    pub(super) hkv: usize,
    pub(super) d: usize,
    pub(super) causal: bool,
}

impl Case {
    pub(super) fn new(lens: &[usize], hq: usize, hkv: usize, d: usize, causal: bool) -> Self {
        Case {
            lens: lens.to_vec(),
            hq,
            hkv,
            d,
            causal,
        }
    }
    pub(super) fn cu(&self) -> Vec<usize> {
        self.lens
            .iter()
            .scan(0, |acc, &l| {
                *acc += l;
                Some(*acc)
            })
            .collect()
    }
    pub(super) fn t(&self) -> usize {
        self.lens.iter().sum()
    }
    pub(super) fn scale(&self) -> f64 {
        1.0 / (self.d as f64).sqrt()
    }
}

/// The shapes every correctness test runs: odd sizes, length 1, empty sequences, head_dim not a
/// multiple of the vector width (1, 5, 7, 24, 40, 72) and 256, GQA ratios 1, 2, 3, 4, MQA,
/// causal and full, sequences crossing the 64-key block boundary.
pub(super) fn cases() -> Vec<Case> {
    vec![
        Case::new(&[1], 1, 1, 1, true),
        Case::new(&[1, 1], 2, 1, 8, false),
        Case::new(&[5, 1, 7], 2, 2, 7, true),
        Case::new(&[33, 17], 4, 2, 24, false),
        Case::new(&[70, 3], 4, 1, 72, true),
        Case::new(&[130], 8, 2, 16, true),
        Case::new(&[65, 64], 2, 1, 256, false),
        Case::new(&[0, 3, 0, 7], 3, 1, 5, true),
        Case::new(&[100, 29], 6, 2, 40, true),
        Case::new(&[64, 96], 4, 4, 64, false),
        Case::new(&[97], 4, 4, 33, true),
    ]
}

/// Random q, k, v, dout (N(0,1); q scaled by 2 so the softmax is peaked, not uniform).
pub(super) struct Data {
    pub(super) q: Vec<f32>,
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
    pub(super) dout: Vec<f32>,
}

pub(super) fn data(c: &Case, seed: u64) -> Data {
    let mut rng = Rng::new(seed);
    let (t, hq, hkv, d) = (c.t(), c.hq, c.hkv, c.d);
    Data {
        q: rng.normal_vec(t * hq * d, 2.0),
        k: rng.normal_vec(t * hkv * d, 1.0),
        v: rng.normal_vec(t * hkv * d, 1.0),
        dout: rng.normal_vec(t * hq * d, 1.0),
    }
}

pub(super) fn round_bf16(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect()
}

pub(super) fn to_f64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

// ---------------------------------------------------------------------------------------------
// Naive float64 reference, written for clarity.

/// Probabilities `P[i][j]` (0 where masked) and `lse[i]` of one sequence and q head `h`.
pub(super) fn naive_probs(
    c: &Case,
    q: &[f64],
    k: &[f64],
    start: usize,
    len: usize,
    h: usize,
) -> (Vec<Vec<f64>>, Vec<f64>) {
    let (hq, hkv, d) = (c.hq, c.hkv, c.d);
    let kvh = h / (hq / hkv);
    let mut probs = vec![vec![0.0; len]; len];
    let mut lse = vec![0.0; len];
    for i in 0..len {
        let qi = &q[((start + i) * hq + h) * d..][..d];
        let visible = if c.causal { i + 1 } else { len };
        let s: Vec<f64> = (0..visible)
            .map(|j| {
                let kj = &k[((start + j) * hkv + kvh) * d..][..d];
                c.scale() * qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>()
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = s.iter().map(|x| (x - m).exp()).sum();
        lse[i] = m + sum.ln();
        for j in 0..visible {
            probs[i][j] = (s[j] - lse[i]).exp();
        }
    }
    (probs, lse)
}

/// `(out [T, Hq, D], lse [T, Hq])`.
pub(super) fn naive_forward(c: &Case, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (t, hq, hkv, d) = (c.t(), c.hq, c.hkv, c.d);
    let mut out = vec![0.0; t * hq * d];
    let mut lse = vec![0.0; t * hq];
    let mut start = 0;
    for &len in &c.lens {
        for h in 0..hq {
            let kvh = h / (hq / hkv);
            let (p, l) = naive_probs(c, q, k, start, len, h);
            for i in 0..len {
                lse[(start + i) * hq + h] = l[i];
                for j in 0..len {
                    for x in 0..d {
                        out[((start + i) * hq + h) * d + x] +=
                            p[i][j] * v[((start + j) * hkv + kvh) * d + x];
                    }
                }
            }
        }
        start += len;
    }
    (out, lse)
}

/// `(dq, dk, dv)` of `L = sum(out * dout)`, by the textbook softmax backward
/// (`dS = P * (dP - rowsum(P * dP))`, not the kernel's `rowsum(dO * O)` form).
pub(super) fn naive_backward(
    c: &Case,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    dout: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (t, hq, hkv, d) = (c.t(), c.hq, c.hkv, c.d);
    let (mut dq, mut dk, mut dv) = (
        vec![0.0; t * hq * d],
        vec![0.0; t * hkv * d],
        vec![0.0; t * hkv * d],
    );
    let mut start = 0;
    for &len in &c.lens {
        for h in 0..hq {
            let kvh = h / (hq / hkv);
            let (p, _) = naive_probs(c, q, k, start, len, h);
            let row = |x: &[f64], heads: usize, hh: usize, i: usize| -> Vec<f64> {
                x[((start + i) * heads + hh) * d..][..d].to_vec()
            };
            for i in 0..len {
                let doi = row(dout, hq, h, i);
                let dp: Vec<f64> = (0..len)
                    .map(|j| {
                        doi.iter()
                            .zip(&row(v, hkv, kvh, j))
                            .map(|(a, b)| a * b)
                            .sum()
                    })
                    .collect();
                let pdp: f64 = (0..len).map(|j| p[i][j] * dp[j]).sum();
                for j in 0..len {
                    let ds = p[i][j] * (dp[j] - pdp) * c.scale();
                    let (qi, kj) = (row(q, hq, h, i), row(k, hkv, kvh, j));
                    for x in 0..d {
                        dq[((start + i) * hq + h) * d + x] += ds * kj[x];
                        dk[((start + j) * hkv + kvh) * d + x] += ds * qi[x];
                        dv[((start + j) * hkv + kvh) * d + x] += p[i][j] * doi[x];
                    }
                }
            }
        }
        start += len;
    }
    (dq, dk, dv)
}

// ---------------------------------------------------------------------------------------------
// Running the kernel.

pub(super) struct Fwd<E> {
    pub(super) out: Vec<E>,
    pub(super) lse: Vec<f32>,
}

pub(super) struct Bwd<E> {
    pub(super) dq: Vec<E>,
    pub(super) dk: Vec<E>,
    pub(super) dv: Vec<E>,
}

pub(super) fn conv<E: Float>(x: &[f32]) -> Vec<E> {
    x.iter().map(|&v| E::from_f32(v)).collect()
}

pub(super) fn widen<E: Float>(x: &[E]) -> Vec<f32> {
    x.iter().map(|&v| v.to_f32()).collect()
}

pub(super) fn run_fwd<E: Float>(isa: Isa, c: &Case, cu: &[usize], x: &Data) -> Fwd<E> {
    let a = VarlenAttention::new(cu, c.t(), c.hq, c.hkv, c.d, c.causal);
    let (q, k, v) = (conv::<E>(&x.q), conv::<E>(&x.k), conv::<E>(&x.v));
    let mut out = vec![E::from_f32(f32::NAN); q.len()];
    let mut lse = vec![f32::NAN; c.t() * c.hq];
    cpu::forward(
        isa,
        &a,
        Qkv {
            q: &q,
            k: &k,
            v: &v,
        },
        &mut out,
        &mut lse,
    );
    Fwd { out, lse }
}

pub(super) fn run_bwd<E: Float>(
    isa: Isa,
    s: BwdSchedule,
    c: &Case,
    cu: &[usize],
    x: &Data,
    f: &Fwd<E>,
) -> Bwd<E> {
    let a = VarlenAttention::new(cu, c.t(), c.hq, c.hkv, c.d, c.causal);
    let (q, k, v, dout) = (
        conv::<E>(&x.q),
        conv::<E>(&x.k),
        conv::<E>(&x.v),
        conv::<E>(&x.dout),
    );
    // Poisoned so that a row the kernel forgets to overwrite shows up.
    let nan = E::from_f32(f32::NAN);
    let (mut dq, mut dk, mut dv) = (vec![nan; q.len()], vec![nan; k.len()], vec![nan; v.len()]);
    let saved = BwdSaved {
        out: &f.out,
        lse: &f.lse,
        dout: &dout,
    };
    let grads = QkvGrad {
        dq: &mut dq,
        dk: &mut dk,
        dv: &mut dv,
    };
    cpu::backward(
        isa,
        s,
        &a,
        Qkv {
            q: &q,
            k: &k,
            v: &v,
        },
        saved,
        grads,
    );
    Bwd { dq, dk, dv }
}

/// Kernel vs naive f64 on `c` for element type E; returns the worst (fwd, lse, bwd) rel L2.
pub(super) fn check_case<E: Float>(
    isa: Isa,
    c: &Case,
    seed: u64,
    bf16_inputs: bool,
) -> (f64, f64, f64) {
    let mut x = data(c, seed);
    if bf16_inputs {
        // The reference sees exactly what the bf16 kernel sees.
        x = Data {
            q: round_bf16(&x.q),
            k: round_bf16(&x.k),
            v: round_bf16(&x.v),
            dout: round_bf16(&x.dout),
        };
    }
    let cu = c.cu();
    let f = run_fwd::<E>(isa, c, &cu, &x);
    let b = run_bwd::<E>(isa, BwdSchedule::Auto, c, &cu, &x, &f);
    let (q, k, v, dout) = (to_f64(&x.q), to_f64(&x.k), to_f64(&x.v), to_f64(&x.dout));
    let (out_r, lse_r) = naive_forward(c, &q, &k, &v);
    let (dq_r, dk_r, dv_r) = naive_backward(c, &q, &k, &v, &dout);
    let e_out = rel_l2(&widen(&f.out), &out_r);
    let e_lse = rel_l2(&f.lse, &lse_r);
    let e_bwd = [
        grad_err(&widen(&b.dq), &dq_r),
        grad_err(&widen(&b.dk), &dk_r),
        grad_err(&widen(&b.dv), &dv_r),
    ]
    .into_iter()
    .fold(0.0, f64::max);
    (e_out, e_lse, e_bwd)
}

/// Relative L2, except against an all-zero reference (dq and dk when every sequence has one
/// key: the softmax over one key has zero gradient), where the relative error is undefined and
/// the largest absolute value is reported instead (rounding leaves ~1e-7 * |dout| there).
pub(super) fn grad_err(a: &[f32], r: &[f64]) -> f64 {
    if r.iter().all(|&x| x == 0.0) {
        a.iter().fold(0.0, |m, &x| m.max(x.abs() as f64))
    } else {
        rel_l2(a, r)
    }
}
