//! Geometry of one attention call and the packing of its operands into f32 tiles.
//!
//! Rows of a query tile: the tile holds `qn` tokens of one sequence starting at position `q0`,
//! and for kv head `kvh` the `g = Hq / Hkv` query heads it serves; row `r = i * g + hh` is token
//! `q0 + i`, query head `kvh * g + hh` (the TND order, so a group's heads are adjacent). Rows
//! are packed to f32 `[rp, dp]`, `rp` = rows rounded up to [`MR`], `dp` = D rounded up to
//! [`NR`], zero padded. Keys come in blocks of [`KB`] aligned to the sequence start, packed as
//! `K^T [D, KB]`, `V^T [D, KB]` (score-side operands) or `K [KB, dp]`, `V [KB, dp]`.
//!
//! Everything is packed once per call (in parallel) and shared read-only by the tile tasks,
//! which also does the bf16 -> f32 widening once.

use std::sync::Mutex;

use rayon::prelude::*;

use super::simd::{dot, KB, MR, NR, QROWS};
use cannon_runtime::Float;

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
            bq: round_up((QROWS / g).max(1), step),
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

/// One sequence: rows `[start, start + len)` of the TND tensors; its key blocks are items
/// `blk0 ..` and its query tiles items `tile0 ..` of the call's [`Packed`] buffers.
#[derive(Clone, Copy, Debug)]
pub(super) struct Span {
    pub start: usize,
    pub len: usize,
    pub blk0: usize,
    pub tile0: usize,
}

/// `(sequence, offset in it, length)` of consecutive blocks of `block` tokens of every
/// sequence, in token order (so the blocks cover every token exactly once).
pub(super) fn blocks(seqs: &[Span], block: usize) -> Vec<(Span, usize, usize)> {
    seqs.iter()
        .flat_map(|&s| {
            (0..s.len)
                .step_by(block)
                .map(move |o| (s, o, block.min(s.len - o)))
        })
        .collect()
}

/// Packs `n` tokens from absolute row `t0` of a `[T, heads, D]` tensor, heads `h0 .. h0 + g`,
/// into `dst [rows, dp]` (row `i * g + hh`); padding columns and rows up to `rows` are zeroed.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // geometry of a strided gather
pub(super) fn pack_rows<E: Float>(
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

/// Transposes rows given as a function into `dst[dd * ld + j] = row(j)[dd] * scale` for
/// `j < n`, `dd < d`, with zeros for `n <= j < width` (`width` a multiple of NR).
///
/// Rows go in groups of NR: each group's NR values of one `dd` are collected in a local array
/// and stored as one contiguous run (a plain element-wise transpose issues one scattered
/// scalar store per value, which showed up as 4 % of a small backward and as the largest
/// non-GEMM cost of the forward). `scale = 1` is exact, so it costs no bits.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // geometry of a strided transpose
pub(super) fn store_transposed<'s, E: Float>(
    row: impl Fn(usize) -> &'s [E],
    n: usize,
    width: usize,
    d: usize,
    scale: f32,
    dst: &mut [f32],
    ld: usize,
) {
    for j0 in (0..width).step_by(NR) {
        let m = NR.min(n.saturating_sub(j0));
        let rows: [&[E]; NR] = std::array::from_fn(|jj| if jj < m { row(j0 + jj) } else { &[] });
        for dd in 0..d {
            let mut v = [0.0f32; NR];
            for (x, r) in v.iter_mut().zip(&rows).take(m) {
                *x = r[dd].to_f32() * scale;
            }
            dst[dd * ld + j0..][..NR].copy_from_slice(&v);
        }
    }
}

/// Packs a key block transposed: `dst[dd * KB + j] = src[t0 + j, h, dd]`, zero for `j >= n`.
#[inline(always)]
fn pack_t<E: Float>(
    src: &[E],
    t0: usize,
    n: usize,
    heads: usize,
    h: usize,
    d: usize,
    dst: &mut [f32],
) {
    let row = |j: usize| &src[((t0 + j) * heads + h) * d..][..d];
    store_transposed(row, n, KB, d, 1.0, dst, KB);
}

/// f32 buffers of earlier calls, process-wide. Reusing them keeps each call from
/// page-faulting megabytes of fresh memory (large allocations are fresh mmaps); the cost is
/// that up to [`POOL_MAX`] buffers of the largest calls stay allocated. The lock is taken a
/// few times per call, never in a loop over tiles.
static POOL: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());

/// Buffers kept (a backward call holds 7 packed operands plus 3 per concurrent task).
const POOL_MAX: usize = 16;

fn pool() -> std::sync::MutexGuard<'static, Vec<Vec<f32>>> {
    // A panic elsewhere while holding the lock leaves a valid Vec: keep using it.
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A buffer of `len` floats with unspecified contents, from the pool if possible.
pub(super) fn take_buf(len: usize) -> Vec<f32> {
    let reused = {
        let mut p = pool();
        // The smallest pooled buffer that fits, else the largest one (grown below).
        let fit = (0..p.len())
            .filter(|&i| p[i].capacity() >= len)
            .min_by_key(|&i| p[i].capacity())
            .or_else(|| (0..p.len()).max_by_key(|&i| p[i].capacity()));
        fit.map(|i| p.swap_remove(i))
    };
    let mut v = reused.unwrap_or_default();
    if v.len() >= len {
        v.truncate(len);
    } else {
        v.resize(len, 0.0);
    }
    v
}

/// Returns a buffer to the pool.
pub(super) fn give_buf(v: Vec<f32>) {
    let mut p = pool();
    if p.len() < POOL_MAX {
        p.push(v);
    }
}

/// One operand packed per (kv head, item), items being the call's key blocks or query tiles,
/// each `per` floats; shared read-only by all tasks.
pub(super) struct Packed {
    per: usize,
    items: usize,
    data: Vec<f32>,
}

impl Packed {
    /// Fills item `(kvh, i)` with `fill(kvh, i, dst)`, in parallel.
    fn build(
        hkv: usize,
        items: usize,
        per: usize,
        fill: impl Fn(usize, usize, &mut [f32]) + Sync,
    ) -> Packed {
        // Every element is written by `fill` (padding included), so stale contents are fine.
        let mut data = take_buf(hkv * items * per);
        if per > 0 {
            data.par_chunks_mut(per)
                .enumerate()
                .for_each(|(i, dst)| fill(i / items, i % items, dst));
        }
        Packed { per, items, data }
    }

    /// K or V `[T, Hkv, D]` per key block: `K^T [D, KB]` if `transposed`, else `[KB, dp]`.
    pub fn key_blocks<E: Float>(
        src: &[E],
        geo: &Geom,
        blocks: &[(Span, usize, usize)],
        transposed: bool,
    ) -> Packed {
        let per = if transposed { geo.d * KB } else { KB * geo.dp };
        Packed::build(geo.hkv, blocks.len(), per, |kvh, b, dst| {
            let (seq, kb0, kn) = blocks[b];
            let t0 = seq.start + kb0;
            if transposed {
                pack_t(src, t0, kn, geo.hkv, kvh, geo.d, dst);
            } else {
                pack_rows(src, t0, kn, geo.hkv, kvh, 1, geo.d, geo.dp, KB, dst);
            }
        })
    }

    /// q or dout `[T, Hq, D]` per query tile: `[rp, dp]` rows of the kv head's q heads.
    pub fn query_tiles<E: Float>(src: &[E], geo: &Geom, tiles: &[(Span, usize, usize)]) -> Packed {
        let rp = geo.tile_rows();
        Packed::build(geo.hkv, tiles.len(), rp * geo.dp, |kvh, t, dst| {
            let (seq, q0, qn) = tiles[t];
            let (g, d, dp) = (geo.g, geo.d, geo.dp);
            pack_rows(src, seq.start + q0, qn, geo.hq, kvh * g, g, d, dp, rp, dst);
        })
    }

    /// [`Packed::query_tiles`] of `dout`, and per row `D = rowsum(dout * out)` as
    /// [`Packed::tile_values`] would give it: one pass over `dout`, the dot read from the row
    /// just packed (in L1) instead of a second sweep over the whole tensor.
    pub fn query_tiles_and_rowdot<E: Float>(
        dout: &[E],
        out: &[E],
        geo: &Geom,
        tiles: &[(Span, usize, usize)],
    ) -> (Packed, Packed) {
        let rp = geo.tile_rows();
        let (g, d, dp, hq) = (geo.g, geo.d, geo.dp, geo.hq);
        let items = tiles.len();
        let per = rp * dp;
        let mut data = take_buf(geo.hkv * items * per);
        let mut di = take_buf(geo.hkv * items * rp);
        if per > 0 {
            data.par_chunks_mut(per)
                .zip(di.par_chunks_mut(rp))
                .enumerate()
                .for_each(|(i, (dst, dst_di))| {
                    let (kvh, t) = (i / items, i % items);
                    let (seq, q0, qn) = tiles[t];
                    let t0 = seq.start + q0;
                    pack_rows(dout, t0, qn, hq, kvh * g, g, d, dp, rp, dst);
                    dst_di.fill(0.0);
                    for (r, x) in dst_di[..qn * g].iter_mut().enumerate() {
                        let o = ((t0 + r / g) * hq + kvh * g + r % g) * d;
                        *x = dot(&dst[r * dp..][..d], &out[o..o + d]);
                    }
                });
        }
        (
            Packed { per, items, data },
            Packed {
                per: rp,
                items,
                data: di,
            },
        )
    }

    /// One value per row `[rp]` of every query tile, `value(t, h)` for token t, q head h;
    /// 0 on padding rows.
    pub fn tile_values(
        geo: &Geom,
        tiles: &[(Span, usize, usize)],
        value: impl Fn(usize, usize) -> f32 + Sync,
    ) -> Packed {
        let rp = geo.tile_rows();
        Packed::build(geo.hkv, tiles.len(), rp, |kvh, t, dst| {
            let (seq, q0, qn) = tiles[t];
            dst.fill(0.0);
            for (r, x) in dst[..qn * geo.g].iter_mut().enumerate() {
                *x = value(seq.start + q0 + r / geo.g, kvh * geo.g + r % geo.g);
            }
        })
    }

    #[inline(always)]
    pub fn item(&self, kvh: usize, i: usize) -> &[f32] {
        &self.data[(kvh * self.items + i) * self.per..][..self.per]
    }
}

impl Drop for Packed {
    fn drop(&mut self) {
        give_buf(std::mem::take(&mut self.data));
    }
}

/// Keys a row at sequence position `pos` may see in the block starting at `kb0` with `kn` keys.
#[inline(always)]
pub(super) fn row_limit(causal: bool, pos: usize, kb0: usize, kn: usize) -> usize {
    if causal {
        kn.min((pos + 1).saturating_sub(kb0))
    } else {
        kn
    }
}

/// Columns worth computing for the panel of rows `r0 .. r0 + MR` (of `r_real` real rows) of a
/// tile at `q0` against the key block at `kb0`: a multiple of NR, 0 when all are masked.
#[inline(always)]
pub(super) fn panel_cols(
    geo: &Geom,
    q0: usize,
    r0: usize,
    r_real: usize,
    kb0: usize,
    kn: usize,
) -> usize {
    let max_pos = q0 + ((r0 + MR).min(r_real) - 1) / geo.g;
    let n = row_limit(geo.causal, max_pos, kb0, kn);
    round_up(n, NR)
}
