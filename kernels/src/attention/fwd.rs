//! Forward tile kernel: one query tile x the q heads of one kv head, online softmax over the
//! key blocks (FlashAttention-2 forward). Instantiated per ISA by `cpu.rs`.
//!
//! The scores are computed transposed, `S^T [keys, rows] = K Q^T`, so that the softmax
//! statistics over keys (max, sum) are element-wise vector operations across the tile's rows
//! instead of one horizontal reduction per row, and the rescale factor is one vector `exp2`
//! per block instead of one scalar `exp2` per row. `P V` then reads `P^T` column-wise.

use super::pack::{round_up, store_transposed, Geom, Packed, Span};
use super::simd::{exp2, panel, ALayout, KB, MR, NR};
use cannon_runtime::Float;

/// Scratch of one forward worker. `ld` = the tile's rows rounded up to NR.
pub(super) struct FwdScratch {
    /// `Q^T [D, ld]`, pre-multiplied by scale * log2(e).
    qt: Vec<f32>,
    /// `S^T`, then `P^T` `[KB, ld]`.
    st: Vec<f32>,
    /// Output accumulator `[ld, dp]`.
    o: Vec<f32>,
    /// Running max (log2 units), running sum and the block's rescale factor, per row `[ld]`.
    m: Vec<f32>,
    l: Vec<f32>,
    alpha: Vec<f32>,
}

impl FwdScratch {
    pub fn new(geo: &Geom) -> Self {
        let ld = round_up(geo.tile_rows(), NR);
        FwdScratch {
            qt: vec![0.0; geo.d * ld],
            st: vec![0.0; KB * ld],
            o: vec![0.0; ld * geo.dp],
            m: vec![0.0; ld],
            l: vec![0.0; ld],
            alpha: vec![0.0; ld],
        }
    }
}

/// One forward job: query tile `[q0, q0 + qn)` of `seq`, the q heads of kv head `kvh`.
pub(super) struct FwdTile<'a, E> {
    pub geo: &'a Geom,
    pub q: &'a [E],
    /// K and V rows `[KB, dp]` of every key block.
    pub k: &'a Packed,
    pub v: &'a Packed,
    pub seq: Span,
    pub q0: usize,
    pub qn: usize,
    pub kvh: usize,
}

/// Forward of one tile. Writes the tile's rows of `out [qn, Hq, D]` and `lse [qn, Hq]` (the
/// task's chunks) for the group's heads.
#[inline(always)]
pub(super) fn fwd_group<E: Float, const FMA: bool, const W: usize>(
    t: &FwdTile<'_, E>,
    out: &mut [E],
    lse: &mut [f32],
    ws: &mut FwdScratch,
) {
    let (geo, seq, q0, qn, kvh) = (t.geo, t.seq, t.q0, t.qn, t.kvh);
    let (g, d, dp) = (geo.g, geo.d, geo.dp);
    let r_real = qn * g;
    let ld = round_up(r_real, NR);
    let FwdScratch {
        qt,
        st,
        o,
        m,
        l,
        alpha,
    } = ws;
    let (qt, o) = (&mut qt[..d * ld], &mut o[..ld * dp]);
    let (m, l, alpha) = (&mut m[..ld], &mut l[..ld], &mut alpha[..ld]);

    // qt[dd, r] = c * q[q0 + r / g, kvh * g + r % g, dd]; zero on padding rows.
    let src_row = |r: usize| {
        let (i, h) = (r / g, kvh * g + r % g);
        &t.q[((seq.start + q0 + i) * geo.hq + h) * d..][..d]
    };
    store_transposed(src_row, r_real, ld, d, geo.c, qt, ld);
    o.fill(0.0);
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);

    let q_last = q0 + qn - 1;
    let mut kb0 = 0;
    while kb0 < seq.len && (!geo.causal || kb0 <= q_last) {
        let kn = KB.min(seq.len - kb0);
        // Keys of the block any row of the tile may see.
        let kmax = if geo.causal {
            kn.min(q_last + 1 - kb0)
        } else {
            kn
        };
        let kr = round_up(kmax, MR);
        let blk = seq.blk0 + kb0 / KB;
        let (k, v) = (t.k.item(kvh, blk), t.v.item(kvh, blk));
        let st = &mut st[..kr * ld];

        // st[kr, ld] = K[kr, D] @ Q^T[D, ld]  (scores in log2 units)
        for j0 in (0..kr).step_by(MR) {
            let k = &k[j0 * dp..];
            panel::<FMA, W, false>(d, ld, ALayout::Rows, k, dp, qt, ld, &mut st[j0 * ld..], ld);
        }
        if geo.causal && kb0 + kmax > q0 + 1 {
            // Rows of tokens before key kb0 + j: a prefix, rows being in token order.
            for (j, row) in st.chunks_exact_mut(ld).enumerate().take(kmax) {
                if kb0 + j > q0 {
                    row[..((kb0 + j - q0) * g).min(ld)].fill(f32::NEG_INFINITY);
                }
            }
        }
        // Online softmax per 16-column chunk, its statistics held in registers: every value
        // the key loops carry is a local array (a slice of `m` or `l` would be re-read and
        // the running sum spilled, one store-forwarding round trip per key).
        for c0 in (0..ld).step_by(NR) {
            let mut mx = [f32::NEG_INFINITY; NR];
            for row in st.chunks_exact(ld).take(kmax) {
                let x = chunk(row, c0);
                for c in 0..NR {
                    mx[c] = if x[c] > mx[c] { x[c] } else { mx[c] };
                }
            }
            let mut mc = *chunk(m, c0);
            let mut ac = [0.0f32; NR];
            for c in 0..NR {
                let m_new = if mx[c] > mc[c] { mx[c] } else { mc[c] };
                // A row that has seen nothing yet keeps m = -inf, alpha = 1, p = 0.
                ac[c] = if m_new == f32::NEG_INFINITY {
                    1.0
                } else {
                    exp2::<FMA>(mc[c] - m_new)
                };
                mc[c] = m_new;
            }
            let mut sum = [0.0f32; NR];
            for row in st.chunks_exact_mut(ld).take(kmax) {
                let x = chunk_mut(row, c0);
                for c in 0..NR {
                    let p = exp2::<FMA>(x[c] - mc[c]);
                    x[c] = p;
                    sum[c] += p;
                }
            }
            let lc = chunk_mut(l, c0);
            for c in 0..NR {
                lc[c] = lc[c] * ac[c] + sum[c];
            }
            *chunk_mut(m, c0) = mc;
            *chunk_mut(alpha, c0) = ac;
        }
        // Keys past kmax (masked for every row) contribute nothing to P V.
        st[kmax * ld..].fill(0.0);
        for (orow, &a) in o.chunks_exact_mut(dp).zip(alpha.iter()).take(r_real) {
            if a != 1.0 {
                for x in orow {
                    *x *= a;
                }
            }
        }
        // o[rows, dp] += P[rows, kr] @ V[kr, dp], P read column-wise from P^T.
        for r0 in (0..round_up(r_real, MR)).step_by(MR) {
            let (pt, orows) = (&st[r0..], &mut o[r0 * dp..]);
            panel::<FMA, W, true>(kr, dp, ALayout::Cols, pt, ld, v, dp, orows, dp);
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

/// The NR-wide chunk of `row` at `c0` (callers keep `c0 + NR <= row.len()`).
#[inline(always)]
fn chunk(row: &[f32], c0: usize) -> &[f32; NR] {
    match row[c0..].first_chunk::<NR>() {
        Some(x) => x,
        None => unreachable!("chunk {c0} past a row of {}", row.len()),
    }
}

/// Mutable twin of [`chunk`].
#[inline(always)]
fn chunk_mut(row: &mut [f32], c0: usize) -> &mut [f32; NR] {
    let n = row.len();
    match row[c0..].first_chunk_mut::<NR>() {
        Some(x) => x,
        None => unreachable!("chunk {c0} past a row of {n}"),
    }
}
