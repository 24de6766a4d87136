//! The tile kernels: one query tile x one kv head (forward, dQ) or one key block x one kv head
//! (dK/dV), written once and instantiated per ISA by `cpu.rs`.
//!
//! Rows of a query tile: the tile holds `qn` tokens of one sequence starting at position `q0`,
//! and for kv head `kvh` the `g = Hq / Hkv` query heads it serves; row `r = i * g + hh` is token
//! `q0 + i`, query head `kvh * g + hh` (the TND order, so a group's heads are adjacent). Rows
//! are packed to f32 `[rp, dp]`, `rp` = rows rounded up to [`MR`], `dp` = D rounded up to
//! [`NR`], zero padded. Keys come in blocks of [`KB`] aligned to the sequence start, packed as
//! `K^T [D, KB]`, `V^T [D, KB]` (score-side operands) and `K [KB, dp]`, `V [KB, dp]`.
//!
//! The backward dQ of a row is accumulated over key blocks in ascending order with the same
//! micro-kernel calls whether it runs inside [`bwd_kv_block`] (fused schedule) or
//! [`bwd_q_tile`] (split schedule), which is why both schedules give identical bits.

use super::simd::{dot, exp2, panel, row_max, row_sum, KB, MR, NR};
use super::{Element, Qkv};

pub(super) fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m) * m
}

/// Shapes and constants shared by every tile of one call.
#[derive(Clone, Copy, Debug)]
pub(super) struct Geom {
    pub hq: usize,
    pub hkv: usize,
    /// q heads per kv head.
    pub g: usize,
    pub d: usize,
    /// D padded to a multiple of NR.
    pub dp: usize,
    pub causal: bool,
    pub scale: f32,
    /// scale * log2(e): scores go straight to the exp2 domain.
    pub c: f32,
    /// Tokens per query tile: about 64 rows per tile, and `bq * g` a multiple of MR so that
    /// only a sequence's last tile has padding rows.
    pub bq: usize,
}

impl Geom {
    pub fn new(hq: usize, hkv: usize, d: usize, causal: bool, scale: f32) -> Self {
        let g = hq / hkv;
        let step = MR / gcd(g, MR);
        Geom {
            hq,
            hkv,
            g,
            d,
            dp: round_up(d, NR),
            causal,
            scale,
            c: scale * std::f32::consts::LOG2_E,
            bq: round_up((KB / g).max(1), step),
        }
    }

    /// Padded rows of a full query tile.
    pub fn tile_rows(&self) -> usize {
        round_up(self.bq * self.g, MR)
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// One sequence: rows `[start, start + len)` of the TND tensors.
#[derive(Clone, Copy, Debug)]
pub(super) struct Span {
    pub start: usize,
    pub len: usize,
}

/// Packs `n` tokens from absolute row `t0` of a `[T, heads, D]` tensor, heads `h0 .. h0 + g`,
/// into `dst [rows, dp]` (row `i * g + hh`); padding columns and rows up to `rows` are zeroed.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // geometry of a strided gather
fn pack_rows<E: Element>(
    src: &[E],
    t0: usize,
    n: usize,
    heads: usize,
    h0: usize,
    g: usize,
    d: usize,
    dp: usize,
    rows: usize,
    dst: &mut [f32],
) {
    for i in 0..n {
        for hh in 0..g {
            let s = &src[((t0 + i) * heads + h0 + hh) * d..][..d];
            let o = &mut dst[(i * g + hh) * dp..][..dp];
            for (x, &y) in o.iter_mut().zip(s) {
                *x = y.to_f32();
            }
            o[d..].fill(0.0);
        }
    }
    dst[n * g * dp..rows * dp].fill(0.0);
}

/// Packs a key block transposed: `dst[dd * KB + j] = src[t0 + j, h, dd]`, zero for `j >= n`.
#[inline(always)]
fn pack_t<E: Element>(
    src: &[E],
    t0: usize,
    n: usize,
    heads: usize,
    h: usize,
    d: usize,
    dst: &mut [f32],
) {
    for j in 0..n {
        let s = &src[((t0 + j) * heads + h) * d..][..d];
        for (dd, &y) in s.iter().enumerate() {
            dst[dd * KB + j] = y.to_f32();
        }
    }
    if n < KB {
        for dd in 0..d {
            dst[dd * KB + n..(dd + 1) * KB].fill(0.0);
        }
    }
}

/// Keys a row at sequence position `pos` may see in the block starting at `kb0` with `kn` keys.
#[inline(always)]
fn row_limit(causal: bool, pos: usize, kb0: usize, kn: usize) -> usize {
    if causal {
        kn.min((pos + 1).saturating_sub(kb0))
    } else {
        kn
    }
}

/// Columns worth computing for the panel of rows `r0 .. r0 + MR` (of `r_real` real rows) of a
/// tile at `q0` against the key block at `kb0`: a multiple of NR, 0 when all are masked.
#[inline(always)]
fn panel_cols(geo: &Geom, q0: usize, r0: usize, r_real: usize, kb0: usize, kn: usize) -> usize {
    let max_pos = q0 + ((r0 + MR).min(r_real) - 1) / geo.g;
    let n = row_limit(geo.causal, max_pos, kb0, kn);
    round_up(n, NR)
}

/// Scratch of one forward worker.
pub(super) struct FwdScratch {
    q: Vec<f32>,
    kt: Vec<f32>,
    v: Vec<f32>,
    s: Vec<f32>,
    o: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
}

impl FwdScratch {
    pub fn new(geo: &Geom) -> Self {
        let rp = geo.tile_rows();
        FwdScratch {
            q: vec![0.0; rp * geo.dp],
            kt: vec![0.0; geo.d * KB],
            v: vec![0.0; KB * geo.dp],
            s: vec![0.0; MR * KB],
            o: vec![0.0; rp * geo.dp],
            m: vec![0.0; rp],
            l: vec![0.0; rp],
        }
    }
}

/// One forward job: query tile `[q0, q0 + qn)` of `seq`, the q heads of kv head `kvh`.
pub(super) struct FwdTile<'a, E> {
    pub geo: &'a Geom,
    pub x: &'a Qkv<'a, E>,
    pub seq: Span,
    pub q0: usize,
    pub qn: usize,
    pub kvh: usize,
}

/// Forward of one tile with the online softmax over key blocks. Writes the tile's rows of
/// `out [qn, Hq, D]` and `lse [qn, Hq]` (the task's chunks) for the group's heads.
#[inline(always)]
pub(super) fn fwd_group<E: Element, const FMA: bool, const W: usize>(
    t: &FwdTile<'_, E>,
    out: &mut [E],
    lse: &mut [f32],
    ws: &mut FwdScratch,
) {
    let (geo, seq, q0, qn, kvh) = (t.geo, t.seq, t.q0, t.qn, t.kvh);
    let (g, d, dp) = (geo.g, geo.d, geo.dp);
    let r_real = qn * g;
    let rp = round_up(r_real, MR);
    let FwdScratch {
        q,
        kt,
        v,
        s,
        o,
        m,
        l,
    } = ws;
    let (q, o, m, l) = (
        &mut q[..rp * dp],
        &mut o[..rp * dp],
        &mut m[..rp],
        &mut l[..rp],
    );
    pack_rows(t.x.q, seq.start + q0, qn, geo.hq, kvh * g, g, d, dp, rp, q);
    o.fill(0.0);
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);

    let q_last = q0 + qn - 1;
    let mut kb0 = 0;
    while kb0 < seq.len && (!geo.causal || kb0 <= q_last) {
        let kn = KB.min(seq.len - kb0);
        pack_t(t.x.k, seq.start + kb0, kn, geo.hkv, kvh, d, kt);
        pack_rows(t.x.v, seq.start + kb0, kn, geo.hkv, kvh, 1, d, dp, KB, v);
        for r0 in (0..rp).step_by(MR) {
            let n16 = panel_cols(geo, q0, r0, r_real, kb0, kn);
            if n16 == 0 {
                continue;
            }
            // s[MR, KB] = q_panel @ K^T (raw dot products)
            panel::<FMA, W, false>(d, n16, &q[r0 * dp..], dp, 1, kt, KB, s, KB);
            for rr in 0..MR {
                let r = r0 + rr;
                let lim = row_limit(geo.causal, q0 + r / g, kb0, kn);
                let row = &mut s[rr * KB..][..n16];
                for (j, x) in row.iter_mut().enumerate() {
                    *x = if j < lim {
                        *x * geo.c
                    } else {
                        f32::NEG_INFINITY
                    };
                }
                let m_old = m[r];
                let mb = row_max(row);
                let m_new = if mb > m_old { mb } else { m_old };
                if m_new == f32::NEG_INFINITY {
                    // Nothing visible yet (only padding rows): contribute nothing.
                    row.fill(0.0);
                    continue;
                }
                for x in row.iter_mut() {
                    *x = exp2::<FMA>(*x - m_new);
                }
                let alpha = exp2::<FMA>(m_old - m_new);
                l[r] = l[r] * alpha + row_sum(row);
                m[r] = m_new;
                if alpha != 1.0 {
                    for x in &mut o[r * dp..][..dp] {
                        *x *= alpha;
                    }
                }
            }
            // o_panel[MR, dp] += p[MR, n16] @ V[n16, dp]
            panel::<FMA, W, true>(n16, dp, s, KB, 1, v, dp, &mut o[r0 * dp..], dp);
        }
        kb0 += KB;
    }

    for r in 0..r_real {
        let (i, h) = (r / g, kvh * g + r % g);
        let dst = &mut out[(i * geo.hq + h) * d..][..d];
        for (y, &x) in dst.iter_mut().zip(&o[r * dp..][..d]) {
            *y = E::from_f32(x / l[r]);
        }
        lse[i * geo.hq + h] = (m[r] + l[r].log2()) * std::f32::consts::LN_2;
    }
}

/// What backward reads besides q/k/v: `dout [T, Hq, D]`, `lse [T, Hq]`, and
/// `di [T, Hq] = rowsum(dout * out)`.
pub(super) struct BwdCtx<'a, E> {
    pub geo: &'a Geom,
    pub x: Qkv<'a, E>,
    pub dout: &'a [E],
    pub lse: &'a [f32],
    pub di: &'a [f32],
}

/// Scratch of one backward worker.
pub(super) struct BwdScratch {
    q: Vec<f32>,
    dout: Vec<f32>,
    lse2: Vec<f32>,
    di: Vec<f32>,
    kt: Vec<f32>,
    vt: Vec<f32>,
    k: Vec<f32>,
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
            q: vec![0.0; rp * dp],
            dout: vec![0.0; rp * dp],
            lse2: vec![0.0; rp],
            di: vec![0.0; rp],
            kt: vec![0.0; geo.d * KB],
            vt: vec![0.0; geo.d * KB],
            k: vec![0.0; KB * dp],
            p: vec![0.0; rp * KB],
            ds: vec![0.0; rp * KB],
            dk: vec![0.0; KB * dp],
            dv: vec![0.0; KB * dp],
            dq: vec![0.0; rp * dp],
        }
    }
}

/// Packs query tile `[q0, q0 + qn)` of `seq` for kv head `kvh`: q, dout, lse (as log2) and di.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // destination buffers are separate scratch fields
fn pack_q_tile<E: Element>(
    c: &BwdCtx<'_, E>,
    seq: Span,
    kvh: usize,
    q0: usize,
    qn: usize,
    q: &mut [f32],
    dout: &mut [f32],
    lse2: &mut [f32],
    di: &mut [f32],
) -> usize {
    let geo = c.geo;
    let (g, rp) = (geo.g, round_up(qn * geo.g, MR));
    let t0 = seq.start + q0;
    pack_rows(c.x.q, t0, qn, geo.hq, kvh * g, g, geo.d, geo.dp, rp, q);
    pack_rows(c.dout, t0, qn, geo.hq, kvh * g, g, geo.d, geo.dp, rp, dout);
    for r in 0..rp {
        let idx = (t0 + r / g) * geo.hq + kvh * g + r % g;
        let real = r < qn * g;
        lse2[r] = if real {
            c.lse[idx] * std::f32::consts::LOG2_E
        } else {
            0.0
        };
        di[r] = if real { c.di[idx] } else { 0.0 };
    }
    rp
}

/// Packed operands of one query tile for backward.
struct QTile<'s> {
    q0: usize,
    r_real: usize,
    q: &'s [f32],
    dout: &'s [f32],
    lse2: &'s [f32],
    di: &'s [f32],
}

/// `P` and unscaled `dS = P * (dP - D)` of rows `r0 .. r0 + MR` of a tile against the key
/// block at `kb0` (`kt`, `vt` = K^T, V^T packed), each written as `[MR, KB]` with zeros past
/// the computed columns. Returns the number of computed columns (0: the panel is masked).
#[inline(always)]
#[allow(clippy::too_many_arguments)] // the panel's coordinates and its two outputs
fn panel_p_ds<const FMA: bool, const W: usize>(
    geo: &Geom,
    t: &QTile<'_>,
    r0: usize,
    kb0: usize,
    kn: usize,
    kt: &[f32],
    vt: &[f32],
    p: &mut [f32],
    ds: &mut [f32],
) -> usize {
    let (d, dp) = (geo.d, geo.dp);
    let n16 = panel_cols(geo, t.q0, r0, t.r_real, kb0, kn);
    if n16 == 0 {
        p.fill(0.0);
        ds.fill(0.0);
        return 0;
    }
    // p <- S = q_panel @ K^T ; ds <- dP = dout_panel @ V^T
    panel::<FMA, W, false>(d, n16, &t.q[r0 * dp..], dp, 1, kt, KB, p, KB);
    panel::<FMA, W, false>(d, n16, &t.dout[r0 * dp..], dp, 1, vt, KB, ds, KB);
    for rr in 0..MR {
        let r = r0 + rr;
        let prow = &mut p[rr * KB..][..KB];
        let drow = &mut ds[rr * KB..][..KB];
        if r >= t.r_real {
            prow.fill(0.0);
            drow.fill(0.0);
            continue;
        }
        let lim = row_limit(geo.causal, t.q0 + r / geo.g, kb0, kn);
        let (l2, di) = (t.lse2[r], t.di[r]);
        for (j, (pj, dj)) in prow[..n16].iter_mut().zip(&mut drow[..n16]).enumerate() {
            let e = exp2::<FMA>(*pj * geo.c - l2);
            let pv = if j < lim { e } else { 0.0 };
            *pj = pv;
            *dj = pv * (*dj - di);
        }
        prow[n16..].fill(0.0);
        drow[n16..].fill(0.0);
    }
    n16
}

/// Packs the key block at `kb0` (`kn` keys) of kv head `kvh`: K^T, V^T and K rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // destination buffers are separate scratch fields
fn pack_kv_block<E: Element>(
    c: &BwdCtx<'_, E>,
    seq: Span,
    kvh: usize,
    kb0: usize,
    kn: usize,
    kt: &mut [f32],
    vt: &mut [f32],
    k: &mut [f32],
) {
    let geo = c.geo;
    let t0 = seq.start + kb0;
    pack_t(c.x.k, t0, kn, geo.hkv, kvh, geo.d, kt);
    pack_t(c.x.v, t0, kn, geo.hkv, kvh, geo.d, vt);
    pack_rows(c.x.k, t0, kn, geo.hkv, kvh, 1, geo.d, geo.dp, KB, k);
}

/// dK, dV (unscaled, into `ws.dk`, `ws.dv` as `[KB, dp]`) of the key block at `kb0` of `seq`
/// for kv head `kvh`, summed over the group's q heads and every query tile that sees it.
/// With `dq = Some(acc)` (the sequence's `[len * g + MR, dp]` rows of this kv head), also
/// accumulates the unscaled dQ contributions of this block: the fused schedule.
#[inline(always)]
pub(super) fn bwd_kv_block<E: Element, const FMA: bool, const W: usize>(
    c: &BwdCtx<'_, E>,
    seq: Span,
    kvh: usize,
    kb0: usize,
    mut dq: Option<&mut [f32]>,
    ws: &mut BwdScratch,
) {
    let geo = c.geo;
    let (g, dp, bq) = (geo.g, geo.dp, geo.bq);
    let kn = KB.min(seq.len - kb0);
    let BwdScratch {
        q,
        dout,
        lse2,
        di,
        kt,
        vt,
        k,
        p,
        ds,
        dk,
        dv,
        ..
    } = ws;
    pack_kv_block(c, seq, kvh, kb0, kn, kt, vt, k);
    dk.fill(0.0);
    dv.fill(0.0);
    let kr = round_up(kn, MR);
    let mut q0 = if geo.causal { kb0 / bq * bq } else { 0 };
    while q0 < seq.len {
        let qn = bq.min(seq.len - q0);
        let rp = pack_q_tile(c, seq, kvh, q0, qn, q, dout, lse2, di);
        let tile = QTile {
            q0,
            r_real: qn * g,
            q,
            dout,
            lse2,
            di,
        };
        for r0 in (0..rp).step_by(MR) {
            let (pp, dsp) = (&mut p[r0 * KB..][..MR * KB], &mut ds[r0 * KB..][..MR * KB]);
            let n16 = panel_p_ds::<FMA, W>(geo, &tile, r0, kb0, kn, kt, vt, pp, dsp);
            if let (true, Some(dq)) = (n16 > 0, dq.as_deref_mut()) {
                // dq_panel[MR, dp] += ds[MR, n16] @ K[n16, dp]
                panel::<FMA, W, true>(
                    n16,
                    dp,
                    dsp,
                    KB,
                    1,
                    k,
                    dp,
                    &mut dq[(q0 * g + r0) * dp..],
                    dp,
                );
            }
        }
        for kr0 in (0..kr).step_by(MR) {
            // dv[kr0.., dp] += P^T[MR, rp] @ dout[rp, dp] ; dk likewise with dS and q
            panel::<FMA, W, true>(rp, dp, &p[kr0..], 1, KB, dout, dp, &mut dv[kr0 * dp..], dp);
            panel::<FMA, W, true>(rp, dp, &ds[kr0..], 1, KB, q, dp, &mut dk[kr0 * dp..], dp);
        }
        q0 += bq;
    }
}

/// dQ of query tile `[q0, q0 + qn)` of `seq` for the q heads of kv head `kvh` (the split
/// schedule's second pass): loops over the key blocks it sees, writes `dq [qn, Hq, D]` (the
/// task's chunk) scaled.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // the tile's coordinates
pub(super) fn bwd_q_tile<E: Element, const FMA: bool, const W: usize>(
    c: &BwdCtx<'_, E>,
    seq: Span,
    kvh: usize,
    q0: usize,
    qn: usize,
    dq_out: &mut [E],
    ws: &mut BwdScratch,
) {
    let geo = c.geo;
    let (g, d, dp) = (geo.g, geo.d, geo.dp);
    let BwdScratch {
        q,
        dout,
        lse2,
        di,
        kt,
        vt,
        k,
        p,
        ds,
        dq,
        ..
    } = ws;
    let rp = pack_q_tile(c, seq, kvh, q0, qn, q, dout, lse2, di);
    let tile = QTile {
        q0,
        r_real: qn * g,
        q,
        dout,
        lse2,
        di,
    };
    let dq = &mut dq[..rp * dp];
    dq.fill(0.0);
    let mut kb0 = 0;
    while kb0 < seq.len && (!geo.causal || kb0 < q0 + qn) {
        let kn = KB.min(seq.len - kb0);
        pack_kv_block(c, seq, kvh, kb0, kn, kt, vt, k);
        for r0 in (0..rp).step_by(MR) {
            let (pp, dsp) = (&mut p[..MR * KB], &mut ds[..MR * KB]);
            let n16 = panel_p_ds::<FMA, W>(geo, &tile, r0, kb0, kn, kt, vt, pp, dsp);
            if n16 > 0 {
                panel::<FMA, W, true>(n16, dp, dsp, KB, 1, k, dp, &mut dq[r0 * dp..], dp);
            }
        }
        kb0 += KB;
    }
    for r in 0..qn * g {
        let (i, h) = (r / g, kvh * g + r % g);
        let dst = &mut dq_out[(i * geo.hq + h) * d..][..d];
        for (y, &x) in dst.iter_mut().zip(&dq[r * dp..][..d]) {
            *y = E::from_f32(x * geo.scale);
        }
    }
}

/// `di[h] = sum_d dout[h, d] * out[h, d]` for the Hq heads of one token.
#[inline(always)]
pub(super) fn rowsum_dout_out<E: Element, const FMA: bool>(
    d: usize,
    dout: &[E],
    out: &[E],
    di: &mut [f32],
    buf: &mut [f32],
) {
    for (h, dst) in di.iter_mut().enumerate() {
        let (a, b) = buf.split_at_mut(d);
        for ((x, y), (&u, &w)) in a
            .iter_mut()
            .zip(&mut b[..d])
            .zip(dout[h * d..][..d].iter().zip(&out[h * d..][..d]))
        {
            *x = u.to_f32();
            *y = w.to_f32();
        }
        *dst = dot::<FMA>(a, &b[..d]);
    }
}
