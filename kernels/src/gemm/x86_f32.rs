//! f32 GEMM for `C = alpha * A^T B + beta * C` with a long `m` (A stored `[k, m]`, B `[k, n]`):
//! the weight gradient `dW = dY^T X` of a wide layer (the lm_head: m = vocab).
//!
//! Why our own: faer turns a row-major C around and packs the stored `dY` a few floats per row,
//! rows `4 m` bytes apart, so its packing is bound by memory latency (~87 % of its square
//! rate on the bench's lm_head shape, while the same product with A stored row-major runs at
//! 100 %). Here each task packs its A block reading every stored row once, front to back, a
//! whole block-width run at a time (the access the hardware prefetcher follows), exactly as
//! the bf16 kernel does for the same layout (x86_bf16.rs).
//!
//! Blocking is that kernel's: B (`[k, n]`, shared) packed once per panel into NR-column strips
//! `bp[s][p][j] = B(p, s*NR + j)`; one task per block of C rows walks the panel's KC sub-blocks
//! with its `mc x nc` tile of C in L2, packing `ap[s][p][i] = A^T(p, i0 + s*MR + i)` per
//! sub-block; an MR x NR register tile of C per kernel call, one broadcast of A per row.
//!
//! All `unsafe` here is intrinsics behind [`available`] and the raw C pointer of disjoint tiles.

use super::x86_tile::{drive, mask16, store_tile, Epi, Packed};
use super::Dims;
use std::arch::x86_64::*;

/// Rows of C per kernel call.
const MR: usize = 14;
/// zmm vectors across C's columns per kernel call.
const NV: usize = 2;
/// Columns of C per kernel call.
const NR: usize = NV * 16;
/// k per sub-block: B micro-panel = KC*NR*4 bytes = 32 KiB.
const KC: usize = 256;
/// Rows of A per block at most: A block = MC_MAX*KC*4 bytes (~252 KiB, in L2).
const MC_MAX: usize = 252;
/// Columns of B per panel: a task's C tile (MC_MAX*NC*4 bytes ~ 0.5 MiB) stays in L2.
const NC: usize = 512;
/// k per packed B panel (a multiple of KC): panel = KO*NC*4 bytes = 8 MiB at most.
const KO: usize = 4096;

/// Whether the CPU has what the kernel executes.
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
}

/// Whether [`gemm_tn`] should run a product instead of faer: A transposed with a long m (the
/// case faer packs from memory a few floats per row), B not transposed, depth worth blocking.
pub(super) fn wins(a_transposed: bool, b_transposed: bool, d: Dims) -> bool {
    a_transposed && !b_transposed && d.m >= 4096 && d.k >= KC && d.n >= NR && available()
}

/// `out[s][p][l] = src[(k0 + p) * ld + lane0 + s*w + l]` for `p < kc`, `s < strips`, `l < w`,
/// zero for lanes at or past `nv` (counted from `lane0`). Walks k outermost: each stored row is
/// read once, front to back.
///
/// # Safety
/// avx512f available; rows `k0..k0+kc`, columns `lane0..lane0+nv` inside `src` at stride `ld`;
/// `out.len() >= strips * kc * w`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)] // a strided block's geometry
unsafe fn pack_across_rows(
    src: &[f32],
    ld: usize,
    lane0: usize,
    nv: usize,
    k0: usize,
    kc: usize,
    w: usize,
    strips: usize,
    out: &mut [u32],
) {
    debug_assert!(out.len() >= strips * kc * w);
    let o = out.as_mut_ptr().cast::<f32>();
    for p in 0..kc {
        let row = src.as_ptr().add((k0 + p) * ld + lane0);
        for s in 0..strips {
            for l0 in (0..w).step_by(16) {
                let lane = s * w + l0;
                let n = nv.saturating_sub(lane).min(16).min(w - l0);
                let v = _mm512_maskz_loadu_ps(mask16(n), row.add(lane));
                _mm512_mask_storeu_ps(o.add((s * kc + p) * w + l0), mask16(w - l0), v);
            }
        }
    }
}

/// The MR x NR kernel over `kc` steps of packed `a` (`[kc][MR]`) and `b` (`[kc][NR]`), result
/// written to the `mr x nr` corner of the tile at `c` (row stride `ldc`).
///
/// # Safety
/// avx512f available; `a`/`b` hold `kc*MR`/`kc*NR` floats with `b` 64-byte aligned; `c` is
/// valid for `mr` rows of `nr` floats at stride `ldc`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    mr: usize,
    nr: usize,
    e: Epi,
) {
    let mut acc = [[_mm512_setzero_ps(); NV]; MR];
    let (mut a, mut b) = (a, b);
    for _ in 0..kc {
        let mut bv = [_mm512_setzero_ps(); NV];
        for (v, bv) in bv.iter_mut().enumerate() {
            *bv = _mm512_load_ps(b.add(v * 16));
        }
        for (i, acc_row) in acc.iter_mut().enumerate() {
            let ai = _mm512_set1_ps(*a.add(i));
            for (acc, &bv) in acc_row.iter_mut().zip(&bv) {
                *acc = _mm512_fmadd_ps(ai, bv, *acc);
            }
        }
        a = a.add(MR);
        b = b.add(NR);
    }
    store_tile::<MR, NV>(&acc, c, ldc, mr, nr, e);
}

/// The f32 kernel's operands (A stored `[k, m]`, B `[k, n]`), as the blocking driver sees
/// them.
struct F32TnKernel<'a> {
    a: &'a [f32],
    lda: usize,
    b: &'a [f32],
    ldb: usize,
}

impl Packed for F32TnKernel<'_> {
    const MR: usize = MR;
    const NR: usize = NR;
    const STEP: usize = 1;
    const KC: usize = KC;
    const MC_MAX: usize = MC_MAX;
    const NC: usize = NC;
    const NC_DEEP: usize = NC;
    const KO: usize = KO;

    fn pack_b(&self, j0: usize, nv: usize, k0: usize, kc: usize, out: &mut [u32]) {
        // SAFETY: avx512f checked (`wins` / the caller of `gemm_tn`); rows k0..k0+kc, columns
        // j0..j0+nv are inside the checked B; out holds kc*NR words.
        unsafe { pack_across_rows(self.b, self.ldb, j0, nv, k0, kc, NR, 1, out) };
    }

    fn pack_a(&self, i0: usize, i1: usize, k0: usize, kc: usize, strips: usize, out: &mut [u32]) {
        // SAFETY: as for B: columns i0..i1 and rows k0..k0+kc of the stored A^T are inside
        // the checked A; out holds strips * kc * MR words.
        unsafe { pack_across_rows(self.a, self.lda, i0, i1 - i0, k0, kc, MR, strips, out) };
    }

    fn prefetch_a(&self, i0: usize, i1: usize, k0: usize, kc: usize, part: usize, parts: usize) {
        // Stored rows k0..k0+kc, a run of i1 - i0 floats each, a slice of them per call: the
        // next sub-block's A arrives in L2 while this one computes, so packing reads from
        // cache, not memory (the layout's whole problem, see the module docs).
        let per = kc.div_ceil(parts.max(1));
        for p in (part * per).min(kc)..((part + 1) * per).min(kc) {
            let row = &self.a[(k0 + p) * self.lda + i0..][..i1 - i0];
            for line in row.chunks(16) {
                // SAFETY: a prefetch never faults; the address is inside `a`.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(line.as_ptr().cast()) };
            }
        }
    }

    unsafe fn kernel(
        steps: usize,
        a: *const u32,
        b: *const u32,
        c: *mut f32,
        ldc: usize,
        mr: usize,
        nr: usize,
        e: Epi,
    ) {
        kernel(steps, a.cast(), b.cast(), c, ldc, mr, nr, e)
    }
}

/// `C = alpha * A^T B + beta * C`, A stored `[k, m]` (stride `lda`), B `[k, n]` (stride
/// `ldb`). Dims and slices were checked by mod.rs; k > 0, alpha != 0; [`available`] is true.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_tn(
    d: Dims,
    alpha: f32,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
    parallel: bool,
) {
    let kern = F32TnKernel { a, lda, b, ldb };
    drive(&kern, d, alpha, beta, c, ldc, parallel);
}

#[cfg(test)]
mod tests {
    use super::{available, gemm_tn};
    use crate::gemm::Dims;
    use crate::testutil::{rel_l2, Rng};

    /// Against a float64 reference on shapes that exercise every edge: partial MR strips,
    /// partial NR strips, several KC sub-blocks with a short last one, several row blocks,
    /// padded strides, beta = 0 (C ignored, even NaN) and beta != 0, alpha != 1.
    #[test]
    fn matches_float64_on_edge_shapes() {
        if !available() {
            return;
        }
        let mut rng = Rng::new(11);
        for &(m, n, k, pa, pb, pc, alpha, beta) in &[
            (
                1usize, 1usize, 1usize, 0usize, 0usize, 0usize, 1.0f32, 0.0f32,
            ),
            (15, 33, 257, 3, 1, 2, 1.0, 0.0),
            (300, 70, 600, 0, 0, 5, 0.5, 1.0),
            (530, 513, 1030, 7, 2, 0, 1.0, -2.0),
        ] {
            let (lda, ldb, ldc) = (m + pa, n + pb, n + pc);
            let a = rng.normal_vec((k - 1) * lda + m, 1.0);
            let b = rng.normal_vec((k - 1) * ldb + n, 1.0);
            let c0 = rng.normal_vec((m - 1) * ldc + n, 1.0);
            let mut c = c0.clone();
            if beta == 0.0 {
                c.iter_mut().for_each(|x| *x = f32::NAN);
            }
            for parallel in [false, true] {
                let mut got = c.clone();
                let d = Dims { m, n, k };
                gemm_tn(d, alpha, &a, lda, &b, ldb, beta, &mut got, ldc, parallel);
                let (mut want, mut have) = (Vec::new(), Vec::new());
                for i in 0..m {
                    for j in 0..n {
                        let mut s = 0.0f64;
                        for p in 0..k {
                            s += a[p * lda + i] as f64 * b[p * ldb + j] as f64;
                        }
                        let old = if beta == 0.0 {
                            0.0
                        } else {
                            c0[i * ldc + j] as f64
                        };
                        want.push(alpha as f64 * s + beta as f64 * old);
                        have.push(got[i * ldc + j]);
                    }
                }
                let e = rel_l2(&have, &want);
                // f32 sums of up to ~1000 products: ~1e-7 * sqrt(k) relative.
                assert!(e <= 1e-5, "{m}x{n}x{k} parallel={parallel}: rel L2 {e:e}");
                // Padding columns of C are never written.
                for i in 0..m {
                    for j in n..ldc.min(got.len() - i * ldc) {
                        assert!(got[i * ldc + j].to_bits() == c[i * ldc + j].to_bits());
                    }
                }
            }
        }
    }
}
