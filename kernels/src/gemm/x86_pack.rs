//! Packing for the AVX512-BF16 kernel: operands -> u32 words `(x[2q], x[2q+1])` along k.
//!
//! Two source orientations, each for bf16 and f32 sources (f32 rounded to nearest even with
//! `vcvtne2ps2bf16`, which also flushes f32 denormals to zero; `vdpbf16ps` treats bf16
//! denormals as zero anyway, so the product is the same as rounding with `half` first):
//!
//! - k along a stored row (A with `N`, B with `T`): each lane's pairs are contiguous, so the
//!   pack is a transpose of `[lanes, kp]` words into `[kp, lanes]`, done in 16 x 16 blocks.
//! - k down the stored columns (A with `T`, B with `N`): pair q interleaves two stored rows.
//!
//! Every load is masked to the valid elements, so no byte past the operand's block is read.

use super::x86_tile::mask16;
use cannon_runtime::Float;
use half::bf16;
use std::any::TypeId;
use std::arch::x86_64::*;

/// A packing source: bf16 bits or f32 values, by the sealed element type.
#[derive(Clone, Copy)]
pub(super) enum Src<'a> {
    Bf16(&'a [u16]),
    F32(&'a [f32]),
}

impl<'a> Src<'a> {
    pub(super) fn new<S: Float>(s: &'a [S]) -> Self {
        if TypeId::of::<S>() == TypeId::of::<bf16>() {
            // SAFETY: S is bf16 (a repr(transparent) u16), so the slice is len u16s.
            Src::Bf16(unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u16>(), s.len()) })
        } else {
            // SAFETY: Float is sealed to bf16 and f32, so S is f32 here.
            Src::F32(unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<f32>(), s.len()) })
        }
    }

    /// Elements `off..off+n` (n <= 32, zero beyond) as 16 bf16 pairs.
    ///
    /// # Safety
    /// avx512f/bw/vl/bf16 available; `off + n <= len`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn pairs16(self, off: usize, n: usize) -> __m512i {
        match self {
            Src::Bf16(s) => {
                debug_assert!(off + n <= s.len());
                let mask: __mmask32 = if n >= 32 { !0 } else { (1u32 << n) - 1 };
                _mm512_maskz_loadu_epi16(mask, s.as_ptr().add(off).cast())
            }
            Src::F32(s) => {
                debug_assert!(off + n <= s.len());
                let (n0, n1) = (n.min(16), n.saturating_sub(16));
                let lo = _mm512_maskz_loadu_ps(mask16(n0), s.as_ptr().add(off));
                let hi = _mm512_maskz_loadu_ps(mask16(n1), s.as_ptr().add(off + n0));
                std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo))
            }
        }
    }

    /// Elements `off..off+n` (n <= 16, zero beyond) as bf16 bits in the low half of 16 u32.
    ///
    /// # Safety
    /// avx512f/bw/vl/bf16 available; `off + n <= len`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn lanes16(self, off: usize, n: usize) -> __m512i {
        if n == 0 {
            return _mm512_setzero_si512();
        }
        let m = mask16(n);
        match self {
            Src::Bf16(s) => {
                debug_assert!(off + n <= s.len());
                _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, s.as_ptr().add(off).cast()))
            }
            Src::F32(s) => {
                debug_assert!(off + n <= s.len());
                let v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, s.as_ptr().add(off)));
                _mm512_cvtepu16_epi32(std::mem::transmute::<__m256bh, __m256i>(v))
            }
        }
    }
}

/// Transposes 16 x 16 u32: row r of the input becomes lane r of every output vector
/// (out[c] lane r = in[r] lane c). Two unpack stages transpose 4 x 4 blocks inside each
/// 128-bit lane, two 128-bit shuffle stages then transpose the 4 x 4 grid of blocks.
#[target_feature(enable = "avx512f")]
unsafe fn transpose16(r: &[__m512i; 16]) -> [__m512i; 16] {
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    // u[4g + c], lane L: column 4L + c of rows 4g..4g+4.
    let mut u = [_mm512_setzero_si512(); 16];
    for g in 0..4 {
        let (t0, t1, t2, t3) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
        u[4 * g] = _mm512_unpacklo_epi64(t0, t2);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t0, t2);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t1, t3);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t1, t3);
    }
    let mut out = [_mm512_setzero_si512(); 16];
    for c in 0..4 {
        let (u0, u1, u2, u3) = (u[c], u[4 + c], u[8 + c], u[12 + c]);
        let v0 = _mm512_shuffle_i32x4::<0b01_00_01_00>(u0, u1);
        let v1 = _mm512_shuffle_i32x4::<0b11_10_11_10>(u0, u1);
        let v2 = _mm512_shuffle_i32x4::<0b01_00_01_00>(u2, u3);
        let v3 = _mm512_shuffle_i32x4::<0b11_10_11_10>(u2, u3);
        out[c] = _mm512_shuffle_i32x4::<0b10_00_10_00>(v0, v2);
        out[4 + c] = _mm512_shuffle_i32x4::<0b11_01_11_01>(v0, v2);
        out[8 + c] = _mm512_shuffle_i32x4::<0b10_00_10_00>(v1, v3);
        out[12 + c] = _mm512_shuffle_i32x4::<0b11_01_11_01>(v1, v3);
    }
    out
}

/// One packing job: `w` lanes starting at stored row/column `lane0` (`nv` of them valid, the
/// rest zero), k range `k0..k0+kc`, into `out` = `[kp][w]` words, `kp = ceil(kc / 2)`.
#[derive(Clone, Copy)]
pub(super) struct Panel {
    pub ld: usize,
    pub lane0: usize,
    pub nv: usize,
    pub k0: usize,
    pub kc: usize,
    pub w: usize,
}

/// k along stored rows: lane l is row `lane0 + l`, pairs contiguous.
///
/// # Safety
/// avx512f/bw/vl/bf16 available; rows `lane0..lane0+nv`, columns `k0..k0+kc` inside `src` at
/// stride `ld`; `out.len() >= kp * w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn pack_k_in_rows(src: Src, p: Panel, out: &mut [u32]) {
    let kp = p.kc.div_ceil(2);
    debug_assert!(out.len() >= kp * p.w);
    let o = out.as_mut_ptr().cast::<i32>();
    for l0 in (0..p.w).step_by(16) {
        let lanes = mask16(p.w - l0);
        for q0 in (0..kp).step_by(16) {
            let n = (p.kc - 2 * q0).min(32);
            let mut rows = [_mm512_setzero_si512(); 16];
            for (r, row) in rows.iter_mut().enumerate() {
                if l0 + r < p.nv {
                    *row = src.pairs16((p.lane0 + l0 + r) * p.ld + p.k0 + 2 * q0, n);
                }
            }
            let cols = transpose16(&rows);
            for (j, col) in cols.iter().enumerate().take(kp - q0) {
                _mm512_mask_storeu_epi32(o.add((q0 + j) * p.w + l0), lanes, *col);
            }
        }
    }
}

/// k down stored columns: lane l is column `lane0 + l`, pair q joins rows `k0+2q`, `k0+2q+1`.
///
/// # Safety
/// As [`pack_k_in_rows`] with rows and columns swapped.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn pack_k_across_rows(src: Src, p: Panel, out: &mut [u32]) {
    pack_block_across_rows(src, p, 1, out)
}

/// [`pack_k_across_rows`] for `strips` consecutive panels of `p.w` lanes at once (`p.nv` valid
/// lanes in all, from `p.lane0`), out = `[strips][kp][w]`. Walking k outermost reads each
/// stored row once, front to back, instead of once per strip: when the rows are far apart (a
/// transposed operand with a large row stride) this is what the hardware prefetcher can follow.
///
/// # Safety
/// As [`pack_k_across_rows`], with `out.len() >= strips * kp * w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn pack_block_across_rows(src: Src, p: Panel, strips: usize, out: &mut [u32]) {
    let kp = p.kc.div_ceil(2);
    debug_assert!(out.len() >= strips * kp * p.w);
    let o = out.as_mut_ptr().cast::<i32>();
    for q in 0..kp {
        let r0 = (p.k0 + 2 * q) * p.ld + p.lane0;
        let has_hi = 2 * q + 1 < p.kc;
        for s in 0..strips {
            for l0 in (0..p.w).step_by(16) {
                let lane = s * p.w + l0;
                let n = p.nv.saturating_sub(lane).min(16).min(p.w - l0);
                let lo = src.lanes16(r0 + lane, n);
                let hi = if has_hi {
                    _mm512_slli_epi32::<16>(src.lanes16(r0 + p.ld + lane, n))
                } else {
                    _mm512_setzero_si512()
                };
                _mm512_mask_storeu_epi32(
                    o.add((s * kp + q) * p.w + l0),
                    mask16(p.w - l0),
                    _mm512_or_si512(lo, hi),
                );
            }
        }
    }
}
