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
//! are their key ranges (the pieces of sequences in chunks are). The forward runs in
//! parallel over distinct query ranges (each task owns its rows), the backward over pairs,
//! its parts added after. GQA as in [`super`]: q head h reads kv head `h / (Hq / Hkv)`.
//!
//! The CPU kernel runs on the f32 GEMM, the forward per (query range, head), the backward
//! per (pair, kv head): the whole `[|q|, |k|]` score block at once (a causal block in bands
//! of 64 rows, so the masked upper triangle is skipped but for each band's own square), its
//! softmax by the SIMD row kernels of [`super::simd`], and the products with V, dout, K and
//! Q; the backward makes `P` and `dS` once per (pair, head) for all three gradients. The NPU
//! bodies (`super::npu`) are FlashAttention calls per
//! pair merged by aclnnRingAttentionUpdate, with the statistics in the NPU's own form.

use super::cpu::{probs_grads_rows, softmax_rows, Isa};
use crate::cast::as_f32;
use crate::error::{check_len, KernelError, Result};
use crate::gemm::{host::gemm_f32, Dims, Trans};
use cannon_runtime::Float;
use rayon::prelude::*;
use std::borrow::Cow;
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

/// The statistics accumulator: `[Tq, Hq, lse_per_head]` (see [`super::check_forward`]).
fn check_lse(op: &'static str, a: &BlockAttention, lse_per_head: usize, lse: usize) -> Result<()> {
    let npu = "lse (softmaxMax + softmaxSum, see block_lse_len_npu)";
    let what = super::lse_name(lse_per_head, npu);
    check_len(op, what, lse, a.q_tokens * a.q_heads * lse_per_head)
}

/// The rules of [`forward_merge`] on every backend (the device-level entry point checks them
/// before any backend runs): `a` valid (heads, pairs inside the blocks, ranges equal or
/// disjoint), q `[Tq, Hq, D]`, k and v `[Tk, Hkv, D]`, out `[Tq, Hq, D]` and lse `[Tq, Hq,
/// lse_per_head]`, `lse_per_head` being the backend's ([`super::lse_per_head`]; 1 here).
pub(crate) fn check_forward(
    a: &BlockAttention,
    lse_per_head: usize,
    [q, k, v]: [usize; 3],
    out: usize,
    lse: usize,
) -> Result<()> {
    a.validate(OP_FWD)?;
    let (ql, kl) = (a.q_len(), a.kv_len());
    for (what, len, want) in [("q", q, ql), ("k", k, kl), ("v", v, kl), ("out", out, ql)] {
        check_len(OP_FWD, what, len, want)?;
    }
    check_lse(OP_FWD, a, lse_per_head, lse)
}

/// The rules of [`backward_accumulate`] on every backend, as [`check_forward`]'s, with dout
/// shaped as out and dq, dk, dv as q, k, v.
pub(crate) fn check_backward(
    a: &BlockAttention,
    lse_per_head: usize,
    [q, k, v]: [usize; 3],
    (out, lse, dout): (usize, usize, usize),
    [dq, dk, dv]: [usize; 3],
) -> Result<()> {
    a.validate(OP_BWD)?;
    let (ql, kl) = (a.q_len(), a.kv_len());
    for (what, len, want) in [("q", q, ql), ("k", k, kl), ("v", v, kl), ("out", out, ql)] {
        check_len(OP_BWD, what, len, want)?;
    }
    check_lse(OP_BWD, a, lse_per_head, lse)?;
    for (what, len, want) in [
        ("dout", dout, ql),
        ("dq", dq, ql),
        ("dk", dk, kl),
        ("dv", dv, kl),
    ] {
        check_len(OP_BWD, what, len, want)?;
    }
    Ok(())
}

/// Row bands of a block: a causal block's band `r` sees keys `..r.end` only, so its products
/// skip the masked upper triangle but for the band's own square; a full block is one band.
fn bands(n: usize, causal: bool) -> Vec<Range<usize>> {
    const BAND: usize = 64;
    if !causal {
        return std::iter::once(0..n).collect();
    }
    (0..n).step_by(BAND).map(|s| s..(s + BAND).min(n)).collect()
}

/// `c = alpha op(a) op(b) + beta c` on the f32 GEMM, `dims` (m, n, k), operands (slice, ld).
fn mm(
    t: (Trans, Trans),
    (m, n, k): (usize, usize, usize),
    alpha: f32,
    a: (&[f32], usize),
    b: (&[f32], usize),
    beta: f32,
    c: (&mut [f32], usize),
) -> Result<()> {
    let dims = Dims { m, n, k };
    gemm_f32(t.0, t.1, dims, alpha, a.0, a.1, b.0, b.1, beta, c.0, c.1)
}

/// The values as f32: borrowed when `E` is f32, else a widened copy.
fn widen<E: Float>(x: &[E]) -> Cow<'_, [f32]> {
    match as_f32(x) {
        Some(same) => Cow::Borrowed(same),
        None => Cow::Owned(x.iter().map(|v| v.to_f32()).collect()),
    }
}

/// The widened operands and shapes one call's tasks share.
struct Ctx<'a> {
    isa: Isa,
    a: &'a BlockAttention<'a>,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
}

impl Ctx<'_> {
    /// `S = scale Q_h[q] K_kvh[k]^T` into `s [|q|, ld]` from column `col` (rows of q and k are
    /// `Hq * D` and `Hkv * D` apart), with the causal block's upper triangle at -inf.
    fn scores(
        &self,
        h: usize,
        (q, k, causal): (&Range<usize>, &Range<usize>, bool),
        s: &mut [f32],
        ld: usize,
        col: usize,
    ) -> Result<()> {
        let (hq, hkv, d) = (self.a.q_heads, self.a.kv_heads, self.a.head_dim);
        let kvh = h / (hq / hkv);
        let kb = &self.k[(k.start * hkv + kvh) * d..];
        for r in bands(q.len(), causal) {
            let w = if causal { r.end } else { k.len() };
            mm(
                (Trans::N, Trans::T),
                (r.len(), w, d),
                self.a.scale,
                (&self.q[((q.start + r.start) * hq + h) * d..], hq * d),
                (kb, hkv * d),
                0.0,
                (&mut s[r.start * ld + col..], ld),
            )?;
        }
        if causal {
            for i in 0..q.len() {
                s[i * ld + col + i + 1..i * ld + col + k.len()].fill(f32::NEG_INFINITY);
            }
        }
        Ok(())
    }
}

/// Merges the block's attention of the pairs into `out [Tq, Hq, D]` and `lse [Tq, Hq]`
/// (f32 accumulators; rows no pair names are left as they are).
///
/// Per query range and head, on the f32 GEMM: `S = scale Q K^T` over the range's key ranges
/// side by side (the causal block's upper triangle masked), the row's softmax statistics,
/// `O = exp(S - max) V`, then the log-sum-exp merge into the accumulators.
pub fn forward_merge<E: Float>(
    a: &BlockAttention,
    q: &[E],
    k: &[E],
    v: &[E],
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<()> {
    forward_merge_on(Isa::detect(), a, (q, k, v), out, lse)
}

/// [`forward_merge`] with the row kernels at `isa` (tests run every level).
pub(super) fn forward_merge_on<E: Float>(
    isa: Isa,
    a: &BlockAttention,
    (q, k, v): (&[E], &[E], &[E]),
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<()> {
    check_forward(a, 1, [q.len(), k.len(), v.len()], out.len(), lse.len())?;
    let groups = a.groups(OP_FWD, true)?;
    let (hq, hkv, d) = (a.q_heads, a.kv_heads, a.head_dim);
    let (q, k, v) = (widen(q), widen(k), widen(v));
    let cx = Ctx {
        isa,
        a,
        q: &q,
        k: &k,
        v: &v,
    };
    let tasks: Vec<(usize, usize)> = (0..groups.len())
        .flat_map(|g| (0..hq).map(move |h| (g, h)))
        .collect();
    // Per task: the block's unnormalised output [n, D] and per row (max + ln sum, sum).
    type Part = (Vec<f32>, Vec<(f32, f32)>);
    let parts: Vec<Part> = tasks
        .par_iter()
        .map(|&(g, h)| {
            let (qr, keys) = &groups[g];
            let n = qr.len();
            let m: usize = keys.iter().map(|(kr, _)| kr.len()).sum();
            let mut s = vec![0f32; n * m];
            let mut col = 0;
            for (kr, causal) in keys {
                cx.scores(h, (qr, kr, *causal), &mut s, m, col)?;
                col += kr.len();
            }
            let mut stats = Vec::with_capacity(n);
            softmax_rows(cx.isa, &mut s, m, n, &mut stats);
            let mut o = vec![0f32; n * d];
            let (mut col, kvh) = (0, h / (hq / hkv));
            for (i, (kr, causal)) in keys.iter().enumerate() {
                let vb = &cx.v[(kr.start * hkv + kvh) * d..];
                let beta = if i == 0 { 0.0 } else { 1.0 };
                for r in bands(n, *causal) {
                    let w = if *causal { r.end } else { kr.len() };
                    mm(
                        (Trans::N, Trans::N),
                        (r.len(), d, w),
                        1.0,
                        (&s[r.start * m + col..], m),
                        (vb, hkv * d),
                        beta,
                        (&mut o[r.start * d..], d),
                    )?;
                }
                col += kr.len();
            }
            Ok((o, stats))
        })
        .collect::<Result<_>>()?;
    for (&(g, h), (o, stats)) in tasks.iter().zip(&parts) {
        let qr = &groups[g].0;
        for (r, &(lse_b, l)) in stats.iter().enumerate() {
            let i = qr.start + r;
            let (acc, dst) = (&mut lse[i * hq + h], &mut out[(i * hq + h) * d..][..d]);
            let new = if *acc == f32::NEG_INFINITY {
                lse_b
            } else {
                let hi = acc.max(lse_b);
                hi + ((*acc - hi).exp() + (lse_b - hi).exp()).ln()
            };
            let (wa, wb) = ((*acc - new).exp(), (lse_b - new).exp() / l);
            dst.iter_mut()
                .zip(&o[r * d..][..d])
                .for_each(|(y, &x)| *y = *y * wa + x * wb);
            *acc = new;
        }
    }
    Ok(())
}

/// `P = exp(S - lse)` and `dS = P (dout V^T - Di)` of head `h`'s queries `q` against keys `k`
/// into `p` and `ds`, `[|q|, |k|]` each (a task's buffers, reused over its heads; `bwd` holds
/// the backward's row statistics and dout).
fn probs_and_grads(
    cx: &Ctx,
    bwd: &Bwd,
    h: usize,
    (q, k, causal): (&Range<usize>, &Range<usize>, bool),
    (p, ds): (&mut [f32], &mut [f32]),
) -> Result<()> {
    let (hq, hkv, d) = (cx.a.q_heads, cx.a.kv_heads, cx.a.head_dim);
    let kvh = h / (hq / hkv);
    let (n, m) = (q.len(), k.len());
    // A causal block's bands leave dS's masked part to the row kernel below, which writes
    // it as P (..) with P = 0 there: zero from the first head on, so no refill per head.
    cx.scores(h, (q, k, causal), p, m, 0)?;
    let da = &bwd.dout[(q.start * hq + h) * d..];
    let vb = &cx.v[(k.start * hkv + kvh) * d..];
    for r in bands(n, causal) {
        let w = if causal { r.end } else { m };
        mm(
            (Trans::N, Trans::T),
            (r.len(), w, d),
            1.0,
            (&da[r.start * hq * d..], hq * d),
            (vb, hkv * d),
            0.0,
            (&mut ds[r.start * m..], m),
        )?;
    }
    let at = q.start * hq + h;
    let (lse, di) = (&bwd.lse[at..], &bwd.di[at..]);
    probs_grads_rows(cx.isa, p, ds, (m, n), lse, di, hq);
    Ok(())
}

/// What the backward's tasks read besides the operands.
struct Bwd<'a> {
    lse: &'a [f32],
    dout: &'a [f32],
    /// `Di = rowsum(dout * out)` per (query row, head).
    di: Vec<f32>,
}

/// Block gradients, ADDED to the f32 accumulators `dq [Tq, Hq, D]`, `dk`, `dv [Tk, Hkv, D]`,
/// from the rows' final `out [Tq, Hq, D]` and `lse [Tq, Hq]` and `dout [Tq, Hq, D]`.
///
/// On the f32 GEMM, per (pair, kv head): `P` and `dS` of each query head recomputed once from
/// the final statistics, then `dQ += scale dS K`, `dK += scale dS^T Q`, `dV += P^T dout`
/// (five products per pair and head).
#[allow(clippy::too_many_arguments)]
pub fn backward_accumulate<E: Float>(
    a: &BlockAttention,
    qkv: (&[E], &[E], &[E]),
    out: &[E],
    lse: &[f32],
    dout: &[E],
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) -> Result<()> {
    let saved = (out, lse, dout);
    backward_accumulate_on(Isa::detect(), a, qkv, saved, (dq, dk, dv))
}

/// [`backward_accumulate`] with the row kernels at `isa` (tests run every level).
pub(super) fn backward_accumulate_on<E: Float>(
    isa: Isa,
    a: &BlockAttention,
    (q, k, v): (&[E], &[E], &[E]),
    (out, lse, dout): (&[E], &[f32], &[E]),
    (dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]),
) -> Result<()> {
    check_backward(
        a,
        1,
        [q.len(), k.len(), v.len()],
        (out.len(), lse.len(), dout.len()),
        [dq.len(), dk.len(), dv.len()],
    )?;
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
    let cx = Ctx {
        isa,
        a,
        q: &q,
        k: &k,
        v: &v,
    };
    let bwd = Bwd {
        lse,
        dout: &dout,
        di,
    };
    // One task per (pair, kv head): P and dS of each of the kv head's query heads are made
    // once and feed all three products; the parts are added to the accumulators after (a
    // pair's query rows and key rows may be another pair's too, so tasks do not own rows).
    let pairs: Vec<(Range<usize>, Range<usize>, bool)> = a
        .groups(OP_BWD, true)?
        .into_iter()
        .flat_map(|(qr, keys)| keys.into_iter().map(move |(kr, c)| (qr.clone(), kr, c)))
        .collect();
    let tasks: Vec<(usize, usize)> = (0..pairs.len())
        .flat_map(|i| (0..hkv).map(move |h| (i, h)))
        .collect();
    // Per task: dQ [g, |q|, D] (the group's heads in order), dK and dV [|k|, D].
    type Part = (Vec<f32>, Vec<f32>, Vec<f32>);
    let parts: Vec<Part> = tasks
        .par_iter()
        .map(|&(i, kvh)| {
            let (qr, kr, causal) = &pairs[i];
            let (n, m) = (qr.len(), kr.len());
            let mut gq = vec![0f32; g * n * d];
            let (mut gk, mut gv) = (vec![0f32; m * d], vec![0f32; m * d]);
            let kb = &cx.k[(kr.start * hkv + kvh) * d..];
            let (mut p, mut ds) = (vec![0f32; n * m], vec![0f32; n * m]);
            for (j, h) in (kvh * g..(kvh + 1) * g).enumerate() {
                probs_and_grads(&cx, &bwd, h, (qr, kr, *causal), (&mut p, &mut ds))?;
                let qa = &cx.q[(qr.start * hq + h) * d..];
                let da = &bwd.dout[(qr.start * hq + h) * d..];
                let gq = &mut gq[j * n * d..][..n * d];
                for r in bands(n, *causal) {
                    let w = if *causal { r.end } else { m };
                    mm(
                        (Trans::N, Trans::N),
                        (r.len(), d, w),
                        scale,
                        (&ds[r.start * m..], m),
                        (kb, hkv * d),
                        0.0,
                        (&mut gq[r.start * d..], d),
                    )?;
                }
                // Key band c meets the queries from c.start on (a causal block's earlier
                // rows have P = dS = 0 there).
                for c in bands(m, *causal) {
                    let q0 = if *causal { c.start } else { 0 };
                    let (at, out) = (q0 * m + c.start, c.start * d);
                    let dims = (c.len(), d, n - q0);
                    let t = (Trans::T, Trans::N);
                    let (qa, da) = ((&qa[q0 * hq * d..], hq * d), (&da[q0 * hq * d..], hq * d));
                    mm(t, dims, scale, (&ds[at..], m), qa, 1.0, (&mut gk[out..], d))?;
                    mm(t, dims, 1.0, (&p[at..], m), da, 1.0, (&mut gv[out..], d))?;
                }
            }
            Ok((gq, gk, gv))
        })
        .collect::<Result<_>>()?;
    for (&(i, kvh), (gq, gk, gv)) in tasks.iter().zip(&parts) {
        let (qr, kr, _) = &pairs[i];
        for (j, h) in (kvh * g..(kvh + 1) * g).enumerate() {
            for (r, row) in gq[j * qr.len() * d..][..qr.len() * d].chunks(d).enumerate() {
                let dst = &mut dq[((qr.start + r) * hq + h) * d..][..d];
                dst.iter_mut().zip(row).for_each(|(y, x)| *y += x);
            }
        }
        for (r, (rk, rv)) in gk.chunks(d).zip(gv.chunks(d)).enumerate() {
            let at = ((kr.start + r) * hkv + kvh) * d;
            dk[at..at + d].iter_mut().zip(rk).for_each(|(y, x)| *y += x);
            dv[at..at + d].iter_mut().zip(rv).for_each(|(y, x)| *y += x);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
