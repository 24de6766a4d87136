//! Blockwise attention between different query and key token sets, for ring attention:
//! a rank's queries against the K/V block of another rank, the block's result merged into
//! running `(out, lse)` accumulators with the log-sum-exp, and the backward that adds the
//! block's share of dQ, dK and dV.
//!
//! ```text
//! q [Tq, Hq, D]   k, v [Tk, Hkv, D]   (E: f32 or bf16 storage)
//! out, lse        [Tq, Hq, D], [Tq, Hq]   f32 accumulators (start: 0 and -inf)
//! pairs           (q rows, k rows, causal): query row q.start + i sees key rows k.start + j
//!                 for every j (full), or for j <= i (causal, q and k of the same length:
//!                 the diagonal block, the same tokens)
//! forward         per row and head, over the keys its pairs give it:
//!                 lse_b = ln sum exp(scale q.k),  o_b = softmax . v
//!                 lse'  = ln(exp lse + exp lse_b),  out' = out e^(lse - lse') + o_b e^(lse_b - lse')
//! backward        with the FINAL out and lse of the rows (after every block) and dout:
//!                 P = exp(scale q.k - lse), Di = rowsum(dout * out), dS = P (dout.v - Di)
//!                 dq += scale dS k,  dk += scale dS^T q,  dv += P^T dout     (f32, accumulated)
//! ```
//!
//! Pairs with the same query rows may list different key rows (a query chunk meets two key
//! chunks of a ring step); two pairs' query ranges are either the same or disjoint, and so
//! are their key ranges (the pieces of sequences in chunks are). The forward and the dQ part
//! run in parallel over distinct query ranges, the dK/dV part over distinct key ranges; each
//! task owns its rows. GQA as in [`super`]: q head h reads kv head `h / (Hq / Hkv)`.
//!
//! This is a plain row-at-a-time implementation (scores of one row, then its softmax and
//! `P V`), not the tiled micro-kernels of the varlen call: correct on every layout, but
//! several times slower per FLOP. The NPU bodies (`super::npu`) are FlashAttention calls per
//! pair merged by aclnnRingAttentionUpdate, with the statistics in the NPU's own form.

use crate::error::{check_len, KernelError, Result};
use cannon_runtime::Float;
use rayon::prelude::*;
use std::ops::Range;

const OP_FWD: &str = "attention_block_forward";
const OP_BWD: &str = "attention_block_backward";

/// Query rows `q` against key rows `k`; `causal`: row `q.start + i` sees keys up to
/// `k.start + i` (q and k the same length).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockPair {
    pub q: Range<usize>,
    pub k: Range<usize>,
    pub causal: bool,
}

/// The static description of one block call.
#[derive(Clone, Copy, Debug)]
pub struct BlockAttention<'a> {
    pub pairs: &'a [BlockPair],
    /// Tq, Tk: rows of q and of k, v.
    pub q_tokens: usize,
    pub k_tokens: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Multiplies `q . k` before the softmax (usually `1 / sqrt(head_dim)`).
    pub scale: f32,
}

/// Pairs grouped by one of their ranges: `(rows, [(other rows, causal)])`, sorted by rows.
pub(super) type Groups = Vec<(Range<usize>, Vec<(Range<usize>, bool)>)>;

impl BlockAttention<'_> {
    pub(super) fn validate(&self, op: &'static str) -> Result<()> {
        let bad = |detail: String| Err(KernelError::InvalidArgument { op, detail });
        if self.q_heads == 0 || self.kv_heads == 0 || !self.q_heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "q_heads ({}) must be a positive multiple of kv_heads ({})",
                self.q_heads, self.kv_heads
            ));
        }
        if self.head_dim == 0 || !self.scale.is_finite() {
            return bad(format!(
                "head_dim {} must be >= 1 and scale {} finite",
                self.head_dim, self.scale
            ));
        }
        for (i, p) in self.pairs.iter().enumerate() {
            if p.q.start > p.q.end || p.q.end > self.q_tokens {
                return bad(format!(
                    "pair {i}: query rows {:?} outside [0, {})",
                    p.q, self.q_tokens
                ));
            }
            if p.k.start > p.k.end || p.k.end > self.k_tokens {
                return bad(format!(
                    "pair {i}: key rows {:?} outside [0, {})",
                    p.k, self.k_tokens
                ));
            }
            if p.causal && p.q.len() != p.k.len() {
                return bad(format!(
                    "pair {i}: a causal block needs as many queries as keys ({:?} vs {:?})",
                    p.q, p.k
                ));
            }
        }
        self.groups(op, true)?;
        self.groups(op, false)?;
        Ok(())
    }

    /// The pairs grouped by query rows (`by_q`) or key rows; ranges must be equal or
    /// disjoint. Empty pairs are dropped.
    pub(super) fn groups(&self, op: &'static str, by_q: bool) -> Result<Groups> {
        let mut v: Vec<(Range<usize>, Range<usize>, bool)> = self
            .pairs
            .iter()
            .filter(|p| !p.q.is_empty() && !p.k.is_empty())
            .map(|p| {
                let (a, b) = if by_q { (&p.q, &p.k) } else { (&p.k, &p.q) };
                (a.clone(), b.clone(), p.causal)
            })
            .collect();
        v.sort_by_key(|(a, b, _)| (a.start, a.end, b.start));
        let mut out: Groups = Vec::new();
        for (a, b, c) in v {
            match out.last_mut() {
                Some((r, list)) if *r == a => list.push((b, c)),
                Some((r, _)) if r.end > a.start => {
                    return Err(KernelError::InvalidArgument {
                        op,
                        detail: format!(
                            "{} rows {r:?} and {a:?} of two pairs overlap without being equal",
                            if by_q { "query" } else { "key" }
                        ),
                    })
                }
                _ => out.push((a, vec![(b, c)])),
            }
        }
        Ok(out)
    }

    pub(super) fn q_len(&self) -> usize {
        self.q_tokens * self.q_heads * self.head_dim
    }

    pub(super) fn kv_len(&self) -> usize {
        self.k_tokens * self.kv_heads * self.head_dim
    }
}

/// Splits `buf` (rows of `per_row`) into the disjoint, sorted row ranges of `groups`.
fn split_rows<'a, T>(mut buf: &'a mut [T], groups: &Groups, per_row: usize) -> Vec<&'a mut [T]> {
    let mut at = 0;
    let mut out = Vec::with_capacity(groups.len());
    for (r, _) in groups {
        let rest = std::mem::take(&mut buf);
        let (_, tail) = rest.split_at_mut((r.start - at) * per_row);
        let (mine, tail) = tail.split_at_mut(r.len() * per_row);
        out.push(mine);
        buf = tail;
        at = r.end;
    }
    out
}

fn widen<E: Float>(x: &[E]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Keys visible to query row `i` of range `q` in the pair `(k, causal)`.
fn visible(q: &Range<usize>, i: usize, k: &Range<usize>, causal: bool) -> Range<usize> {
    if causal {
        k.start..k.start + (i - q.start) + 1
    } else {
        k.clone()
    }
}

/// Merges the block's attention of the pairs into `out [Tq, Hq, D]` and `lse [Tq, Hq]`
/// (f32 accumulators; rows no pair names are left as they are).
pub fn forward_merge<E: Float>(
    a: &BlockAttention,
    q: &[E],
    k: &[E],
    v: &[E],
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<()> {
    a.validate(OP_FWD)?;
    check_len(OP_FWD, "q", q.len(), a.q_len())?;
    check_len(OP_FWD, "k", k.len(), a.kv_len())?;
    check_len(OP_FWD, "v", v.len(), a.kv_len())?;
    check_len(OP_FWD, "out", out.len(), a.q_len())?;
    check_len(OP_FWD, "lse", lse.len(), a.q_tokens * a.q_heads)?;
    let groups = a.groups(OP_FWD, true)?;
    let (hq, hkv, d) = (a.q_heads, a.kv_heads, a.head_dim);
    let g = hq / hkv;
    let (q, k, v) = (widen(q), widen(k), widen(v));
    let outs = split_rows(out, &groups, hq * d);
    let lses = split_rows(lse, &groups, hq);
    groups
        .par_iter()
        .zip(outs)
        .zip(lses)
        .for_each(|(((qr, keys), out), lse)| {
            let mut s: Vec<f32> = Vec::new();
            let mut o = vec![0.0f32; d];
            for i in qr.clone() {
                for h in 0..hq {
                    let qrow = &q[(i * hq + h) * d..][..d];
                    let kvh = h / g;
                    s.clear();
                    for (kr, causal) in keys {
                        for j in visible(qr, i, kr, *causal) {
                            s.push(a.scale * dot(qrow, &k[(j * hkv + kvh) * d..][..d]));
                        }
                    }
                    if s.is_empty() {
                        continue;
                    }
                    let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                    o.fill(0.0);
                    let mut l = 0.0f32;
                    let mut n = 0;
                    for (kr, causal) in keys {
                        for j in visible(qr, i, kr, *causal) {
                            let p = (s[n] - m).exp();
                            n += 1;
                            l += p;
                            let vrow = &v[(j * hkv + kvh) * d..][..d];
                            o.iter_mut().zip(vrow).for_each(|(y, &x)| *y += p * x);
                        }
                    }
                    let lse_b = m + l.ln();
                    let row = i - qr.start;
                    let (acc, dst) = (&mut lse[row * hq + h], &mut out[(row * hq + h) * d..][..d]);
                    let new = if *acc == f32::NEG_INFINITY {
                        lse_b
                    } else {
                        let hi = acc.max(lse_b);
                        hi + ((*acc - hi).exp() + (lse_b - hi).exp()).ln()
                    };
                    let (wa, wb) = ((*acc - new).exp(), (lse_b - new).exp() / l);
                    dst.iter_mut()
                        .zip(&o)
                        .for_each(|(y, &x)| *y = *y * wa + x * wb);
                    *acc = new;
                }
            }
        });
    Ok(())
}

/// Block gradients, ADDED to the f32 accumulators `dq [Tq, Hq, D]`, `dk`, `dv [Tk, Hkv, D]`,
/// from the rows' final `out [Tq, Hq, D]` and `lse [Tq, Hq]` and `dout [Tq, Hq, D]`.
#[allow(clippy::too_many_arguments)]
pub fn backward_accumulate<E: Float>(
    a: &BlockAttention,
    (q, k, v): (&[E], &[E], &[E]),
    out: &[E],
    lse: &[f32],
    dout: &[E],
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) -> Result<()> {
    a.validate(OP_BWD)?;
    let (ql, kl) = (a.q_len(), a.kv_len());
    for (what, len, want) in [
        ("q", q.len(), ql),
        ("k", k.len(), kl),
        ("v", v.len(), kl),
        ("out", out.len(), ql),
        ("lse", lse.len(), a.q_tokens * a.q_heads),
        ("dout", dout.len(), ql),
        ("dq", dq.len(), ql),
        ("dk", dk.len(), kl),
        ("dv", dv.len(), kl),
    ] {
        check_len(OP_BWD, what, len, want)?;
    }
    let (hq, hkv, d, scale) = (a.q_heads, a.kv_heads, a.head_dim, a.scale);
    let g = hq / hkv;
    let (q, k, v, dout) = (widen(q), widen(k), widen(v), widen(dout));
    let di: Vec<f32> = (0..a.q_tokens * hq)
        .map(|x| {
            let o = &out[x * d..][..d];
            o.iter()
                .zip(&dout[x * d..][..d])
                .map(|(a, b)| a.to_f32() * b)
                .sum()
        })
        .collect();
    // P and dS of (query row i, head h) against key row j.
    let p_ds = |i: usize, h: usize, j: usize| -> (f32, f32) {
        let l = lse[i * hq + h];
        if l == f32::NEG_INFINITY {
            return (0.0, 0.0);
        }
        let kvh = h / g;
        let (qrow, krow) = (&q[(i * hq + h) * d..][..d], &k[(j * hkv + kvh) * d..][..d]);
        let p = (scale * dot(qrow, krow) - l).exp();
        let dp = dot(
            &dout[(i * hq + h) * d..][..d],
            &v[(j * hkv + kvh) * d..][..d],
        );
        (p, p * (dp - di[i * hq + h]))
    };
    let by_q = a.groups(OP_BWD, true)?;
    let by_k = a.groups(OP_BWD, false)?;
    let dq_part = || {
        let dqs = split_rows(dq, &by_q, hq * d);
        by_q.par_iter().zip(dqs).for_each(|((qr, keys), dq)| {
            for i in qr.clone() {
                for h in 0..hq {
                    let dst = &mut dq[((i - qr.start) * hq + h) * d..][..d];
                    for (kr, causal) in keys {
                        for j in visible(qr, i, kr, *causal) {
                            let (_, ds) = p_ds(i, h, j);
                            let krow = &k[(j * hkv + h / g) * d..][..d];
                            dst.iter_mut()
                                .zip(krow)
                                .for_each(|(y, &x)| *y += scale * ds * x);
                        }
                    }
                }
            }
        })
    };
    let dkv_part = || {
        let dks = split_rows(dk, &by_k, hkv * d);
        let dvs = split_rows(dv, &by_k, hkv * d);
        by_k.par_iter()
            .zip(dks)
            .zip(dvs)
            .for_each(|(((kr, queries), dk), dv)| {
                for j in kr.clone() {
                    let jj = j - kr.start;
                    for kvh in 0..hkv {
                        let o = (jj * hkv + kvh) * d;
                        for (qr, causal) in queries {
                            // Causal: query i sees key j when j - k.start <= i - q.start.
                            let first = if *causal { qr.start + jj } else { qr.start };
                            for i in first..qr.end {
                                for h in kvh * g..(kvh + 1) * g {
                                    let (p, ds) = p_ds(i, h, j);
                                    let qrow = &q[(i * hq + h) * d..][..d];
                                    let dorow = &dout[(i * hq + h) * d..][..d];
                                    for c in 0..d {
                                        dk[o + c] += scale * ds * qrow[c];
                                        dv[o + c] += p * dorow[c];
                                    }
                                }
                            }
                        }
                    }
                }
            })
    };
    rayon::join(dq_part, dkv_part);
    Ok(())
}

#[cfg(test)]
mod tests;
