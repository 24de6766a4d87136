//! Forward tile kernel: one query tile x the q heads of one kv head, online softmax over the
//! key blocks (FlashAttention-2 forward). Instantiated per ISA by `cpu.rs`.

use super::pack::{pack_rows, panel_cols, round_up, row_limit, Geom, Packed, Span};
use super::simd::{exp2, panel, row_max, row_sum, ALayout, KB, MR};
use super::Element;

/// Scratch of one forward worker.
pub(super) struct FwdScratch {
    q: Vec<f32>,
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
    pub q: &'a [E],
    /// K^T and V rows of every key block.
    pub kt: &'a Packed,
    pub v: &'a Packed,
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
    let FwdScratch { q, s, o, m, l } = ws;
    let (q, o, m, l) = (
        &mut q[..rp * dp],
        &mut o[..rp * dp],
        &mut m[..rp],
        &mut l[..rp],
    );
    pack_rows(t.q, seq.start + q0, qn, geo.hq, kvh * g, g, d, dp, rp, q);
    o.fill(0.0);
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);

    let q_last = q0 + qn - 1;
    let mut kb0 = 0;
    while kb0 < seq.len && (!geo.causal || kb0 <= q_last) {
        let kn = KB.min(seq.len - kb0);
        let blk = seq.blk0 + kb0 / KB;
        let (kt, v) = (t.kt.item(kvh, blk), t.v.item(kvh, blk));
        for r0 in (0..rp).step_by(MR) {
            let n16 = panel_cols(geo, q0, r0, r_real, kb0, kn);
            if n16 == 0 {
                continue;
            }
            // s[MR, KB] = q_panel @ K^T (raw dot products)
            panel::<FMA, W, false>(d, n16, ALayout::Rows, &q[r0 * dp..], dp, kt, KB, s, KB);
            for rr in 0..MR {
                let r = r0 + rr;
                let lim = row_limit(geo.causal, q0 + r / g, kb0, kn);
                let row = &mut s[rr * KB..][..n16];
                for x in row.iter_mut() {
                    *x *= geo.c;
                }
                row[lim.min(n16)..].fill(f32::NEG_INFINITY);
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
            panel::<FMA, W, true>(n16, dp, ALayout::Rows, s, KB, v, dp, &mut o[r0 * dp..], dp);
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
