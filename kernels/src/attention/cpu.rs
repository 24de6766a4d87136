//! CPU scheduling of the fused attention: packing, task lists, rayon, per-ISA entry points.
//!
//! Forward: one task per (sequence, query tile), looping over the kv heads; each task owns the
//! contiguous rows `[t0, t0 + qn)` of `out` and `lse`, so no two tasks write the same memory.
//!
//! Backward has two schedules with identical results (see bwd.rs):
//! - fused: one task per (sequence, kv head) runs the whole FlashAttention-2 loop (key blocks
//!   outer, query tiles inner) with a task-local dQ accumulator: 5 GEMM-shaped products per
//!   tile pair, but parallel only over sequences x kv heads;
//! - split: a dK/dV pass with one task per (sequence, key block) and a dQ pass with one task
//!   per (sequence, query tile), run concurrently: 7 products per tile pair (S and dP are
//!   recomputed), but finely parallel.
//!
//! `Auto` picks fused when a longest-processing-time assignment of its tasks to the pool's
//! threads is expected to finish before the split schedule's 7/5 extra work would.

use rayon::prelude::*;

use super::bwd::{self, BwdCtx, BwdScratch};
use super::fwd::{self, FwdScratch, FwdTile};
use super::pack::{blocks, give_buf, take_buf, Geom, Packed, Span};
use super::simd::{self, KB, MR};
use super::{Qkv, QkvGrad, VarlenAttention};
use cannon_runtime::Float;

/// A SIMD level whose presence was checked at run time. Only [`Isa::detect`] and
/// [`Isa::available`] construct one, which is what makes the `unsafe` calls below sound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Isa(Level);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
    Portable,
}

impl Isa {
    /// The best level this CPU supports.
    pub fn detect() -> Isa {
        Isa::available()[0]
    }

    /// Every level this CPU supports, best first (tests run each).
    pub fn available() -> Vec<Isa> {
        let mut v = Vec::with_capacity(3);
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            if avx2 && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl") {
                v.push(Isa(Level::Avx512));
            }
            if avx2 {
                v.push(Isa(Level::Avx2Fma));
            }
        }
        v.push(Isa(Level::Portable));
        v
    }
}

/// Defines a safe dispatcher over [`Isa`] for a tile kernel, with one `#[target_feature]`
/// entry point per SIMD level. The kernels and everything they call are `#[inline(always)]`
/// (and free of closures), so each entry point is a full copy compiled for its ISA.
macro_rules! isa_dispatch {
    ($vis:vis $name:ident, $module:ident::$kernel:ident, <$($g:ident: $b:path),*>, ($($arg:ident: $ty:ty),*)) => {
        #[allow(clippy::too_many_arguments)] // the kernel's own arguments, plus `isa`
        $vis fn $name<$($g: $b),*>(isa: Isa, $($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
            #[allow(clippy::too_many_arguments)]
            unsafe fn avx512<$($g: $b),*>($($arg: $ty),*) {
                $module::$kernel::<$($g,)* true, 64>($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            #[allow(clippy::too_many_arguments)]
            unsafe fn avx2<$($g: $b),*>($($arg: $ty),*) {
                $module::$kernel::<$($g,)* true, 16>($($arg),*)
            }
            match isa.0 {
                // SAFETY: an `Isa` holding Avx512 is only built after `is_x86_feature_detected!`
                // confirmed avx512f, avx512vl, avx2 and fma on this CPU.
                #[cfg(target_arch = "x86_64")]
                Level::Avx512 => unsafe { avx512::<$($g),*>($($arg),*) },
                // SAFETY: as above, for avx2 and fma.
                #[cfg(target_arch = "x86_64")]
                Level::Avx2Fma => unsafe { avx2::<$($g),*>($($arg),*) },
                Level::Portable => $module::$kernel::<$($g,)* false, 16>($($arg),*),
            }
        }
    };
}

isa_dispatch!(fwd_group, fwd::fwd_group, <E: Float>, (
    t: &FwdTile<'_, E>, out: &mut [E], lse: &mut [f32], ws: &mut FwdScratch
));
isa_dispatch!(bwd_kv_block, bwd::bwd_kv_block, <>, (
    c: &BwdCtx<'_>, seq: Span, kvh: usize, kb0: usize, dq: Option<&mut [f32]>,
    ws: &mut BwdScratch
));
isa_dispatch!(bwd_q_tile, bwd::bwd_q_tile, <E: Float>, (
    c: &BwdCtx<'_>, seq: Span, kvh: usize, q0: usize, qn: usize, dq_out: &mut [E],
    ws: &mut BwdScratch
));

isa_dispatch!(pub(super) softmax_rows, simd::softmax_rows, <>, (
    s: &mut [f32], m: usize, n: usize, stats: &mut Vec<(f32, f32)>
));
isa_dispatch!(pub(super) probs_grads_rows, simd::probs_grads_rows, <>, (
    p: &mut [f32], ds: &mut [f32], mn: (usize, usize), lse: &[f32], di: &[f32], stride: usize
));

fn geom(a: &VarlenAttention) -> Geom {
    Geom::new(a.q_heads, a.kv_heads, a.head_dim, a.causal, a.scale)
}

fn spans(a: &VarlenAttention, bq: usize) -> Vec<Span> {
    let (mut blk0, mut tile0) = (0, 0);
    a.sequences()
        .into_iter()
        .map(|(start, len)| {
            let s = Span {
                start,
                len,
                blk0,
                tile0,
            };
            blk0 += len.div_ceil(KB);
            tile0 += len.div_ceil(bq);
            s
        })
        .collect()
}

/// Splits `s` into consecutive chunks of `rows * per_row` elements, one per block.
fn chunks<'a, T>(
    mut s: &'a mut [T],
    blocks: &[(Span, usize, usize)],
    per_row: usize,
) -> Vec<&'a mut [T]> {
    let mut v = Vec::with_capacity(blocks.len());
    for &(_, _, n) in blocks {
        let (head, tail) = std::mem::take(&mut s).split_at_mut(n * per_row);
        v.push(head);
        s = tail;
    }
    v
}

pub(super) fn forward<E: Float>(
    isa: Isa,
    a: &VarlenAttention,
    x: Qkv<E>,
    out: &mut [E],
    lse: &mut [f32],
) {
    // One hand-off to the pool per call; every parallel step inside then forks from a worker
    // (called from outside the pool, each `par_iter`/`join` would be a separate injection that
    // blocks the caller until a worker wakes up).
    rayon::scope(|_| forward_in_pool(isa, a, x, out, lse));
}

fn forward_in_pool<E: Float>(
    isa: Isa,
    a: &VarlenAttention,
    x: Qkv<E>,
    out: &mut [E],
    lse: &mut [f32],
) {
    let geo = geom(a);
    let seqs = spans(a, geo.bq);
    let kblocks = blocks(&seqs, KB);
    let (k, v) = rayon::join(
        || Packed::key_blocks(x.k, &geo, &kblocks, false),
        || Packed::key_blocks(x.v, &geo, &kblocks, false),
    );
    let tiles = blocks(&seqs, geo.bq);
    let outs = chunks(out, &tiles, geo.hq * geo.d);
    let lses = chunks(lse, &tiles, geo.hq);
    tiles.into_par_iter().zip(outs).zip(lses).for_each_init(
        || FwdScratch::new(&geo),
        |ws, (((seq, q0, qn), out), lse)| {
            for kvh in 0..geo.hkv {
                let t = FwdTile {
                    geo: &geo,
                    q: x.q,
                    k: &k,
                    v: &v,
                    seq,
                    q0,
                    qn,
                    kvh,
                };
                fwd_group(isa, &t, out, lse, ws);
            }
        },
    );
}

/// What the forward produced, plus the incoming gradient.
pub(super) struct BwdSaved<'a, E> {
    pub out: &'a [E],
    pub lse: &'a [f32],
    pub dout: &'a [E],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BwdSchedule {
    Auto,
    #[cfg_attr(not(test), allow(dead_code))]
    Fused,
    #[cfg_attr(not(test), allow(dead_code))]
    Split,
}

/// Fused when its (sequence, kv head) tasks, cost ~ len^2 each, balance well enough over the
/// pool's threads: longest-first greedy makespan vs the split schedule's ideal 7/5 * total / P.
fn prefer_fused(seqs: &[Span], hkv: usize, threads: usize) -> bool {
    let mut costs: Vec<f64> = seqs
        .iter()
        .flat_map(|s| std::iter::repeat_n((s.len as f64).powi(2), hkv))
        .collect();
    costs.sort_by(|x, y| y.total_cmp(x));
    let mut load = vec![0.0f64; threads.max(1)];
    for c in &costs {
        if let Some(m) = load.iter_mut().min_by(|x, y| x.total_cmp(y)) {
            *m += c;
        }
    }
    let makespan = load.iter().cloned().fold(0.0, f64::max);
    let total: f64 = costs.iter().sum();
    makespan <= 1.4 * total / load.len() as f64
}

pub(super) fn backward<E: Float>(
    isa: Isa,
    schedule: BwdSchedule,
    a: &VarlenAttention,
    x: Qkv<E>,
    saved: BwdSaved<E>,
    grads: QkvGrad<E>,
) {
    // As in `forward`: one hand-off to the pool per call.
    rayon::scope(|_| backward_in_pool(isa, schedule, a, x, saved, grads));
}

fn backward_in_pool<E: Float>(
    isa: Isa,
    schedule: BwdSchedule,
    a: &VarlenAttention,
    x: Qkv<E>,
    saved: BwdSaved<E>,
    grads: QkvGrad<E>,
) {
    let geo = geom(a);
    let seqs = spans(a, geo.bq);
    let hq = geo.hq;
    let kblocks = blocks(&seqs, KB);
    let tiles = blocks(&seqs, geo.bq);
    let (kt, vt, k, q, dout, lse2, di);
    (kt, vt) = rayon::join(
        || Packed::key_blocks(x.k, &geo, &kblocks, true),
        || Packed::key_blocks(x.v, &geo, &kblocks, true),
    );
    (k, q) = rayon::join(
        || Packed::key_blocks(x.k, &geo, &kblocks, false),
        || Packed::query_tiles(x.q, &geo, &tiles),
    );
    (lse2, (dout, di)) = rayon::join(
        || {
            Packed::tile_values(&geo, &tiles, |t, h| {
                saved.lse[t * hq + h] * std::f32::consts::LOG2_E
            })
        },
        || Packed::query_tiles_and_rowdot(saved.dout, saved.out, &geo, &tiles),
    );
    let ctx = BwdCtx {
        geo: &geo,
        kt: &kt,
        vt: &vt,
        k: &k,
        q: &q,
        dout: &dout,
        lse2: &lse2,
        di: &di,
    };
    let fused = match schedule {
        BwdSchedule::Auto => prefer_fused(&seqs, geo.hkv, rayon::current_num_threads()),
        BwdSchedule::Fused => true,
        BwdSchedule::Split => false,
    };
    if fused {
        backward_fused(isa, &ctx, &seqs, grads);
    } else {
        backward_split(isa, &ctx, &seqs, grads);
    }
}

/// Writes `src[..d] * scale` as E into `dst[..d]`.
fn store_row<E: Float>(dst: &mut [E], src: &[f32], scale: f32) {
    for (y, &x) in dst.iter_mut().zip(src) {
        *y = E::from_f32(x * scale);
    }
}

/// Unscaled gradients of one (sequence, kv head): dq `[len * g + MR, dp]` (rows `i * g + hh`),
/// dk and dv `[len, dp]`, in pooled buffers.
struct UnitGrads {
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
}

fn backward_fused<E: Float>(isa: Isa, c: &BwdCtx<'_>, seqs: &[Span], grads: QkvGrad<E>) {
    let geo = c.geo;
    let (g, d, dp, scale) = (geo.g, geo.d, geo.dp, geo.scale);
    let units: Vec<(Span, usize)> = seqs
        .iter()
        .flat_map(|&s| (0..geo.hkv).map(move |kvh| (s, kvh)))
        .collect();
    let results: Vec<UnitGrads> = units
        .par_iter()
        .map_init(
            || BwdScratch::new(geo),
            |ws, &(seq, kvh)| {
                let mut u = UnitGrads {
                    dq: take_buf((seq.len * g + MR) * dp),
                    dk: take_buf(seq.len * dp),
                    dv: take_buf(seq.len * dp),
                };
                u.dq.fill(0.0);
                for kb0 in (0..seq.len).step_by(KB) {
                    bwd_kv_block(isa, c, seq, kvh, kb0, Some(&mut u.dq), ws);
                    let rows = KB.min(seq.len - kb0) * dp;
                    u.dk[kb0 * dp..][..rows].copy_from_slice(&ws.dk[..rows]);
                    u.dv[kb0 * dp..][..rows].copy_from_slice(&ws.dv[..rows]);
                }
                u
            },
        )
        .collect();
    // The write-back in parallel too, over chunks of WB tokens (each unit's rows interleave
    // with the other kv heads' in the TND outputs, so the chunks are of tokens, not of units).
    // `units` lists the kv heads of each sequence in order: unit (s, kvh) is `s * hkv + kvh`.
    const WB: usize = 64;
    let (hq, hkv) = (geo.hq, geo.hkv);
    let dqs = grads.dq.par_chunks_mut(WB * hq * d);
    let dks = grads.dk.par_chunks_mut(WB * hkv * d);
    let dvs = grads.dv.par_chunks_mut(WB * hkv * d);
    dqs.zip(dks)
        .zip(dvs)
        .enumerate()
        .for_each(|(ci, ((dq, dk), dv))| {
            for tt in 0..dq.len() / (hq * d) {
                let t = ci * WB + tt;
                // The sequence holding token t (empty sequences end at their start: skipped).
                let si = seqs.partition_point(|s| s.start + s.len <= t);
                let i = t - seqs[si].start;
                for kvh in 0..hkv {
                    let u = &results[si * hkv + kvh];
                    for hh in 0..g {
                        let dst = &mut dq[(tt * hq + kvh * g + hh) * d..][..d];
                        store_row(dst, &u.dq[(i * g + hh) * dp..], scale);
                    }
                    let o = (tt * hkv + kvh) * d;
                    store_row(&mut dk[o..o + d], &u.dk[i * dp..], scale);
                    store_row(&mut dv[o..o + d], &u.dv[i * dp..], 1.0);
                }
            }
        });
    for u in results {
        give_buf(u.dq);
        give_buf(u.dk);
        give_buf(u.dv);
    }
}

fn backward_split<E: Float>(isa: Isa, c: &BwdCtx<'_>, seqs: &[Span], grads: QkvGrad<E>) {
    let geo = c.geo;
    let (hq, hkv, d, dp, scale) = (geo.hq, geo.hkv, geo.d, geo.dp, geo.scale);
    let kblocks = blocks(seqs, KB);
    let qtiles = blocks(seqs, geo.bq);
    let dks = chunks(grads.dk, &kblocks, hkv * d);
    let dvs = chunks(grads.dv, &kblocks, hkv * d);
    let dqs = chunks(grads.dq, &qtiles, hq * d);
    let kv_pass = || {
        kblocks.par_iter().zip(dks).zip(dvs).for_each_init(
            || BwdScratch::new(geo),
            |ws, ((&(seq, kb0, kn), dk), dv)| {
                for kvh in 0..hkv {
                    bwd_kv_block(isa, c, seq, kvh, kb0, None, ws);
                    for j in 0..kn {
                        let o = (j * hkv + kvh) * d;
                        store_row(&mut dk[o..o + d], &ws.dk[j * dp..], scale);
                        store_row(&mut dv[o..o + d], &ws.dv[j * dp..], 1.0);
                    }
                }
            },
        )
    };
    let q_pass = || {
        qtiles.par_iter().zip(dqs).for_each_init(
            || BwdScratch::new(geo),
            |ws, (&(seq, q0, qn), dq)| {
                for kvh in 0..hkv {
                    bwd_q_tile(isa, c, seq, kvh, q0, qn, dq, ws);
                }
            },
        )
    };
    rayon::join(kv_pass, q_pass);
}
