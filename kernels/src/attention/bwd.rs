//! Backward tile kernels (FlashAttention-2 backward), instantiated per ISA by `cpu.rs`.
//!
//! Per query tile x key block pair: `S = q K^T`, `P = exp(scale S - lse)` (recomputed from the
//! saved LSE), `dP = dout V^T`, `dS = P (dP - D)` with `D = rowsum(dout * out)`; then
//! `dV += P^T dout`, `dK += dS^T q`, `dQ += dS K` (dK, dQ scaled once at the end).
//!
//! A row's dQ is accumulated over key blocks in ascending order with the same micro-kernel
//! calls whether it runs inside [`bwd_kv_block`] (fused schedule) or [`bwd_q_tile`] (split
//! schedule), and dK/dV over query tiles in ascending order by the same code in both, which is
//! why both schedules give identical bits.

use super::pack::{panel_cols, round_up, row_limit, Geom, Packed, Span};
use super::simd::{col_chunks, exp2, panel, ALayout, KB, MR};
use cannon_runtime::Float;

/// Everything backward reads, packed once per call (see pack.rs): per key block K^T, V^T and
/// K rows; per query tile q and dout rows `[rp, dp]`, and per row the LSE in log2 units and
/// `D = rowsum(dout * out)`.
pub(super) struct BwdCtx<'a> {
    pub geo: &'a Geom,
    pub kt: &'a Packed,
    pub vt: &'a Packed,
    pub k: &'a Packed,
    pub q: &'a Packed,
    pub dout: &'a Packed,
    pub lse2: &'a Packed,
    pub di: &'a Packed,
}

/// The packed operands of one query tile.
struct QTile<'s> {
    q0: usize,
    r_real: usize,
    q: &'s [f32],
    dout: &'s [f32],
    lse2: &'s [f32],
    di: &'s [f32],
}

/// The packed operands of one key block.
struct KBlock<'s> {
    kn: usize,
    kt: &'s [f32],
    vt: &'s [f32],
    k: &'s [f32],
}

impl BwdCtx<'_> {
    #[inline(always)]
    fn tile(&self, seq: Span, kvh: usize, q0: usize, qn: usize) -> QTile<'_> {
        let t = seq.tile0 + q0 / self.geo.bq;
        QTile {
            q0,
            r_real: qn * self.geo.g,
            q: self.q.item(kvh, t),
            dout: self.dout.item(kvh, t),
            lse2: self.lse2.item(kvh, t),
            di: self.di.item(kvh, t),
        }
    }

    #[inline(always)]
    fn block(&self, seq: Span, kvh: usize, kb0: usize) -> KBlock<'_> {
        let b = seq.blk0 + kb0 / KB;
        KBlock {
            kn: KB.min(seq.len - kb0),
            kt: self.kt.item(kvh, b),
            vt: self.vt.item(kvh, b),
            k: self.k.item(kvh, b),
        }
    }
}

/// Scratch of one backward worker.
pub(super) struct BwdScratch {
    p: Vec<f32>,
    ds: Vec<f32>,
    /// dK, dV of the current key block `[KB, dp]`, unscaled (read them after `bwd_kv_block`).
    pub dk: Vec<f32>,
    pub dv: Vec<f32>,
    dq: Vec<f32>,
}

impl BwdScratch {
    pub fn new(geo: &Geom) -> Self {
        let (rp, dp) = (geo.tile_rows(), geo.dp);
        BwdScratch {
            p: vec![0.0; rp * KB],
            ds: vec![0.0; rp * KB],
            dk: vec![0.0; KB * dp],
            dv: vec![0.0; KB * dp],
            dq: vec![0.0; rp * dp],
        }
    }
}

/// `P` and unscaled `dS = P * (dP - D)` of every row of a tile against the key block at
/// `kb0`, each written as `[rp, KB]` with zeros past each row's visible keys.
///
/// Phased by operand: S for every panel of MR rows (reading K^T), then dP for every panel
/// (reading V^T), then the element-wise step. Each 16 KiB right-hand operand then stays in L1
/// across the tile's panels instead of the two evicting each other panel by panel. Every row
/// goes through the same operations in the same order either way, so the bits do not depend
/// on the phasing.
#[inline(always)]
fn tile_p_ds<const FMA: bool, const W: usize>(
    geo: &Geom,
    t: &QTile<'_>,
    kb0: usize,
    kb: &KBlock<'_>,
    p: &mut [f32],
    ds: &mut [f32],
) {
    let (d, dp) = (geo.d, geo.dp);
    let rp = round_up(t.r_real, MR);
    // p <- S = q @ K^T ; ds <- dP = dout @ V^T, panel by panel, only the columns some row of
    // the panel may see (rows of a fully masked panel are zero-filled below).
    for (src, bt, dst) in [(t.q, kb.kt, &mut *p), (t.dout, kb.vt, &mut *ds)] {
        for r0 in (0..rp).step_by(MR) {
            let n16 = panel_cols(geo, t.q0, r0, t.r_real, kb0, kb.kn);
            if n16 > 0 {
                let (a, c) = (&src[r0 * dp..], &mut dst[r0 * KB..]);
                panel::<FMA, W, false>(d, n16, ALayout::Rows, a, dp, bt, KB, c, KB);
            }
        }
    }
    for (r, (prow, drow)) in p
        .chunks_exact_mut(KB)
        .zip(ds.chunks_exact_mut(KB))
        .enumerate()
        .take(rp)
    {
        // Keys this row sees (a prefix, within the columns computed for its panel).
        let lim = if r < t.r_real {
            row_limit(geo.causal, t.q0 + r / geo.g, kb0, kb.kn)
        } else {
            0
        };
        let (l2, di) = (t.lse2[r], t.di[r]);
        for (pj, dj) in prow[..lim].iter_mut().zip(&mut drow[..lim]) {
            let pv = exp2::<FMA>(*pj * geo.c - l2);
            *pj = pv;
            *dj = pv * (*dj - di);
        }
        prow[lim..].fill(0.0);
        drow[lim..].fill(0.0);
    }
}

/// `dq[rp, dp] += dS[rp, n] @ K[n, dp]` panel by panel, `n` = the panel's visible columns.
#[inline(always)]
fn tile_dq<const FMA: bool, const W: usize>(
    geo: &Geom,
    t: &QTile<'_>,
    kb0: usize,
    kb: &KBlock<'_>,
    ds: &[f32],
    dq: &mut [f32],
) {
    let dp = geo.dp;
    for r0 in (0..round_up(t.r_real, MR)).step_by(MR) {
        let n16 = panel_cols(geo, t.q0, r0, t.r_real, kb0, kb.kn);
        if n16 > 0 {
            let (a, c) = (&ds[r0 * KB..], &mut dq[r0 * dp..]);
            panel::<FMA, W, true>(n16, dp, ALayout::Rows, a, KB, kb.k, dp, c, dp);
        }
    }
}

/// dK, dV (unscaled, into `ws.dk`, `ws.dv` as `[KB, dp]`) of the key block at `kb0` of `seq`
/// for kv head `kvh`, summed over the group's q heads and every query tile that sees it.
/// With `dq = Some(acc)` (the sequence's `[len * g + MR, dp]` rows of this kv head), also
/// accumulates the unscaled dQ contributions of this block: the fused schedule.
#[inline(always)]
pub(super) fn bwd_kv_block<const FMA: bool, const W: usize>(
    c: &BwdCtx<'_>,
    seq: Span,
    kvh: usize,
    kb0: usize,
    mut dq: Option<&mut [f32]>,
    ws: &mut BwdScratch,
) {
    let geo = c.geo;
    let (g, dp, bq) = (geo.g, geo.dp, geo.bq);
    let kb = c.block(seq, kvh, kb0);
    let BwdScratch { p, ds, dk, dv, .. } = ws;
    dk.fill(0.0);
    dv.fill(0.0);
    let kr = round_up(kb.kn, MR);
    let mut q0 = if geo.causal { kb0 / bq * bq } else { 0 };
    while q0 < seq.len {
        let qn = bq.min(seq.len - q0);
        let t = c.tile(seq, kvh, q0, qn);
        let rp = round_up(t.r_real, MR);
        tile_p_ds::<FMA, W>(geo, &t, kb0, &kb, p, ds);
        if let Some(dq) = dq.as_deref_mut() {
            tile_dq::<FMA, W>(geo, &t, kb0, &kb, ds, &mut dq[q0 * g * dp..]);
        }
        // dv[kr, dp] += P^T[kr, rows] @ dout[rows, dp] ; dk likewise with dS and q. Column
        // chunks outside, key panels inside: one [rows, W] chunk of dout (q) stays in L1 across
        // the key panels (key panels outside would stream the whole 16 KiB operand from L2
        // once per MR keys). Same micro-kernel calls either way, so the same bits.
        for (a, b, c) in [(&*p, t.dout, &mut *dv), (&*ds, t.q, &mut *dk)] {
            for (j, w) in col_chunks::<W>(dp) {
                for kr0 in (0..kr).step_by(MR) {
                    // Causal: the tile's rows of tokens before key kb0 + kr0 see none of the
                    // panel's keys (P = dS = 0 there); skipping them drops only exact
                    // `+ 0 * x` steps, so the sums keep their bits.
                    let rs = if geo.causal {
                        ((kb0 + kr0).saturating_sub(q0) * g).min(rp)
                    } else {
                        0
                    };
                    if rs == rp {
                        continue;
                    }
                    let (at, bt) = (&a[rs * KB + kr0..], &b[rs * dp + j..]);
                    let ct = &mut c[kr0 * dp + j..];
                    panel::<FMA, W, true>(rp - rs, w, ALayout::Cols, at, KB, bt, dp, ct, dp);
                }
            }
        }
        q0 += bq;
    }
}

/// dQ of query tile `[q0, q0 + qn)` of `seq` for the q heads of kv head `kvh` (the split
/// schedule's second pass): loops over the key blocks it sees, writes `dq [qn, Hq, D]` (the
/// task's chunk) scaled.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // the tile's coordinates
pub(super) fn bwd_q_tile<E: Float, const FMA: bool, const W: usize>(
    c: &BwdCtx<'_>,
    seq: Span,
    kvh: usize,
    q0: usize,
    qn: usize,
    dq_out: &mut [E],
    ws: &mut BwdScratch,
) {
    let geo = c.geo;
    let (g, d, dp) = (geo.g, geo.d, geo.dp);
    let BwdScratch { p, ds, dq, .. } = ws;
    let t = c.tile(seq, kvh, q0, qn);
    let rp = round_up(t.r_real, MR);
    let dq = &mut dq[..rp * dp];
    dq.fill(0.0);
    let mut kb0 = 0;
    while kb0 < seq.len && (!geo.causal || kb0 < q0 + qn) {
        let kb = c.block(seq, kvh, kb0);
        tile_p_ds::<FMA, W>(geo, &t, kb0, &kb, p, ds);
        tile_dq::<FMA, W>(geo, &t, kb0, &kb, ds, dq);
        kb0 += KB;
    }
    for r in 0..t.r_real {
        let (i, h) = (r / g, kvh * g + r % g);
        let dst = &mut dq_out[(i * geo.hq + h) * d..][..d];
        for (y, &x) in dst.iter_mut().zip(&dq[r * dp..][..d]) {
            *y = E::from_f32(x * geo.scale);
        }
    }
}
