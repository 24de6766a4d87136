//! What the two packed AVX-512 kernels (x86_bf16.rs, x86_f32.rs) share: aligned per-thread
//! packing buffers, the split of C's rows into tasks, the raw C pointer of disjoint tiles and
//! the `alpha * acc + beta * C` epilogue of a register tile.

use std::arch::x86_64::*;
use std::cell::Cell;

/// One cache line of packed 32-bit words (bf16 pairs, or f32 bit patterns); packed buffers
/// are made of these so they are 64-byte aligned.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(super) struct Line([u32; 16]);

type BufKey = std::thread::LocalKey<Cell<Vec<Line>>>;

thread_local! {
    // Reused packing buffers (bounded by the kernels' block sizes: B <= 8 MiB per calling
    // thread, A ~0.3 MiB per worker). Moved out while in use, so a GEMM that starts on the
    // same thread meanwhile (nested, or stolen by rayon while this one waits) finds none and
    // allocates its own.
    pub(super) static A_BUF: Cell<Vec<Line>> = const { Cell::new(Vec::new()) };
    pub(super) static B_BUF: Cell<Vec<Line>> = const { Cell::new(Vec::new()) };
}

/// The thread's buffer behind `key`, grown to at least `words` 32-bit words.
pub(super) fn take_buf(key: &'static BufKey, words: usize) -> Vec<Line> {
    let mut v = key.with(|c| c.take());
    let lines = words.div_ceil(16);
    if v.len() < lines {
        v.resize(lines, Line([0; 16]));
    }
    v
}

/// Gives a buffer back to the thread for its next GEMM.
pub(super) fn put_buf(key: &'static BufKey, v: Vec<Line>) {
    key.with(|c| c.set(v));
}

/// The lines as contiguous u32 words.
pub(super) fn words(v: &mut [Line]) -> &mut [u32] {
    let len = v.len() * 16;
    // SAFETY: Line is repr(C) [u32; 16] with no padding, so the lines are len contiguous u32s.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u32>(), len) }
}

/// The first `n` of 16 lanes.
pub(super) fn mask16(n: usize) -> __mmask16 {
    if n >= 16 {
        0xFFFF
    } else {
        ((1u32 << n) - 1) as u16
    }
}

/// The C pointer shared by the threads, each of which writes only its own tiles.
#[derive(Clone, Copy)]
pub(super) struct CPtr(pub *mut f32);
// SAFETY: the kernels' tasks write disjoint tiles of C, and C outlives the parallel region.
unsafe impl Send for CPtr {}
unsafe impl Sync for CPtr {}

/// How C's rows (and, when there are too few, column strips) are split into tasks: row blocks
/// of whole `mr`-row strips (at most `mc_max` rows), as even as strips allow, their count a
/// multiple of the thread count so that no thread waits long at the end of a panel.
pub(super) struct Split {
    mr: usize,
    m_strips: usize,
    pub m_blocks: usize,
    pub n_groups: usize,
}

impl Split {
    pub fn new(m: usize, mr: usize, mc_max: usize, strips: usize, threads: usize) -> Self {
        let m_strips = m.div_ceil(mr);
        let mut m_blocks = m.div_ceil(mc_max);
        if threads > 1 {
            m_blocks = m_blocks.div_ceil(threads) * threads;
        }
        let m_blocks = m_blocks.min(m_strips).max(1);
        let n_groups = if m_blocks >= threads {
            1
        } else {
            threads.div_ceil(m_blocks).min(strips).max(1)
        };
        Split {
            mr,
            m_strips,
            m_blocks,
            n_groups,
        }
    }

    /// Rows `i0..i1` of row block `ib`.
    pub fn rows(&self, ib: usize, m: usize) -> (usize, usize) {
        let s0 = self.m_strips * ib / self.m_blocks;
        let s1 = self.m_strips * (ib + 1) / self.m_blocks;
        (s0 * self.mr, (s1 * self.mr).min(m))
    }
}

/// Epilogue of one kernel call: `C = alpha*acc + beta*C` (C not read if !read_c).
#[derive(Clone, Copy)]
pub(super) struct Epi {
    pub alpha: f32,
    pub beta: f32,
    pub read_c: bool,
}

/// Writes the `mr x nr` corner of a register tile to `c` (row stride `ldc`) through `e`.
///
/// # Safety
/// avx512f available; `c` valid for `mr` rows of `nr` floats at stride `ldc`.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn store_tile<const MR: usize, const NV: usize>(
    acc: &[[__m512; NV]; MR],
    c: *mut f32,
    ldc: usize,
    mr: usize,
    nr: usize,
    e: Epi,
) {
    let va = _mm512_set1_ps(e.alpha);
    let vb = _mm512_set1_ps(e.beta);
    for (i, acc_row) in acc.iter().enumerate().take(mr) {
        let row = c.add(i * ldc);
        for (v, &acc) in acc_row.iter().enumerate() {
            let col = v * 16;
            if col >= nr {
                break;
            }
            let mask = mask16(nr - col);
            let mut r = _mm512_mul_ps(acc, va);
            if e.read_c {
                let old = _mm512_maskz_loadu_ps(mask, row.add(col));
                r = _mm512_fmadd_ps(old, vb, r);
            }
            _mm512_mask_storeu_ps(row.add(col), mask, r);
        }
    }
}

/// One packed kernel: its tile and block sizes, how it packs A and B into 32-bit words, and
/// its register kernel. [`drive`] runs the blocking around it.
pub(super) trait Packed: Sync {
    /// Rows and columns of C per kernel call.
    const MR: usize;
    const NR: usize;
    /// k per packed step (2 for bf16 pairs, 1 for f32).
    const STEP: usize;
    /// k per sub-block (a multiple of STEP): the B micro-panel stays in L1.
    const KC: usize;
    /// Rows of A per block at most: the A block stays in L2.
    const MC_MAX: usize;
    /// Columns of B per panel when k fits one KC block, and when it spans several (then a
    /// task's `mc x nc` tile of C stays in L2 while it walks the sub-blocks).
    const NC: usize;
    const NC_DEEP: usize;
    /// k per packed B panel (a multiple of KC).
    const KO: usize;

    /// Packs op(B) columns `j0..j0+nv` (zero up to NR) at depth `k0..k0+kc` into
    /// `out = [steps][NR]` words.
    fn pack_b(&self, j0: usize, nv: usize, k0: usize, kc: usize, out: &mut [u32]);

    /// Packs op(A) rows `i0..i1` at depth `k0..k0+kc` into `out = [strips][steps][MR]` words
    /// (zero past `i1`).
    fn pack_a(&self, i0: usize, i1: usize, k0: usize, kc: usize, strips: usize, out: &mut [u32]);

    /// Hints slice `part` of `parts` of what `pack_a(i0, i1, k0, kc, ..)` will read into the
    /// cache (called once per B strip while the previous sub-block computes). None by default.
    fn prefetch_a(&self, i0: usize, i1: usize, k0: usize, kc: usize, part: usize, parts: usize) {
        let _ = (i0, i1, k0, kc, part, parts);
    }

    /// `C[mr, nr] = alpha * A B + beta * C` over `steps` packed steps of `a` (`[steps][MR]`)
    /// and `b` (`[steps][NR]`).
    ///
    /// # Safety
    /// The kernel's CPU features are available; `a`/`b` hold `steps*MR`/`steps*NR` words with
    /// `b` 64-byte aligned; `c` is valid for `mr` rows of `nr` floats at stride `ldc`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn kernel(
        steps: usize,
        a: *const u32,
        b: *const u32,
        c: *mut f32,
        ldc: usize,
        mr: usize,
        nr: usize,
        e: Epi,
    );
}

/// `C = alpha * op(A) op(B) + beta * C` through kernel `K` (dims and slices already checked,
/// k > 0, alpha != 0, the kernel's features available).
///
/// Loops (GotoBLAS/BLIS): B panels of `nc` columns x `ko` depth, packed once and shared by
/// all threads; in each, one task per row block (or, for short products, per column group)
/// walks the panel's KC sub-blocks itself, packing its A block per sub-block, so its C tile
/// stays in L2 across them instead of streaming through memory once per sub-block.
#[allow(clippy::too_many_arguments)]
pub(super) fn drive<K: Packed>(
    kern: &K,
    d: super::Dims,
    alpha: f32,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
    parallel: bool,
) {
    use rayon::prelude::*;
    let (mr_, nr_) = (K::MR, K::NR);
    let threads = if parallel {
        rayon::current_num_threads()
    } else {
        1
    };
    let kc_max = K::KC.min(d.k.div_ceil(K::STEP) * K::STEP);
    let steps_max = kc_max / K::STEP;
    let ko_max = (K::KO / kc_max * kc_max).min(d.k.div_ceil(kc_max) * kc_max);
    let nc_cap = if d.k > K::KC { K::NC_DEEP } else { K::NC };
    let nc_max = nc_cap.min(d.n.div_ceil(nr_) * nr_);
    // [sub-block][strip][steps_max][NR] words; a short last sub-block uses a prefix of its slot.
    let slot = steps_max * nr_;
    let mut bbuf = take_buf(&B_BUF, ko_max / kc_max * (nc_max / nr_) * slot);
    let cptr = CPtr(c.as_mut_ptr());

    for jc in (0..d.n).step_by(nc_max) {
        let nc = nc_max.min(d.n - jc);
        let strips = nc.div_ceil(nr_);
        let sp = Split::new(d.m, mr_, K::MC_MAX, strips, threads);
        for pco in (0..d.k).step_by(ko_max) {
            let ko = ko_max.min(d.k - pco);
            let nkb = ko.div_ceil(kc_max);
            // (k0, kc) of sub-block kb.
            let sub = |kb: usize| {
                let k0 = pco + kb * kc_max;
                (k0, kc_max.min(d.k - k0))
            };
            let bwords = &mut words(&mut bbuf)[..nkb * strips * slot];
            let pack_b = |(i, out): (usize, &mut [u32])| {
                let (kb, s) = (i / strips, i % strips);
                let (k0, kc) = sub(kb);
                let j0 = jc + s * nr_;
                kern.pack_b(j0, nr_.min(d.n - j0), k0, kc, out);
            };
            if threads > 1 {
                bwords.par_chunks_mut(slot).enumerate().for_each(pack_b);
            } else {
                bwords.chunks_mut(slot).enumerate().for_each(pack_b);
            }
            let bp: &[u32] = bwords;
            let task = |t: usize| {
                let (ib, g) = (t / sp.n_groups, t % sp.n_groups);
                let (i0, i1) = sp.rows(ib, d.m);
                let (s0, s1) = (strips * g / sp.n_groups, strips * (g + 1) / sp.n_groups);
                let a_strips = (i1 - i0).div_ceil(mr_);
                let mut abuf = take_buf(&A_BUF, a_strips * steps_max * mr_);
                for kb in 0..nkb {
                    let (k0, kc) = sub(kb);
                    let steps = kc.div_ceil(K::STEP);
                    let e = Epi {
                        alpha,
                        beta: if k0 == 0 { beta } else { 1.0 },
                        read_c: k0 > 0 || beta != 0.0,
                    };
                    let aw = &mut words(&mut abuf)[..a_strips * steps * mr_];
                    kern.pack_a(i0, i1, k0, kc, a_strips, aw);
                    let next = (kb + 1 < nkb).then(|| sub(kb + 1));
                    for s in s0..s1 {
                        if let Some((k1, kc1)) = next {
                            kern.prefetch_a(i0, i1, k1, kc1, s - s0, s1 - s0);
                        }
                        let j0 = s * nr_;
                        let nr = nr_.min(nc - j0);
                        let bs = &bp[(kb * strips + s) * slot..][..steps * nr_];
                        for (ia, asl) in aw.chunks(steps * mr_).enumerate() {
                            let r0 = i0 + ia * mr_;
                            let mr = mr_.min(d.m - r0);
                            let cp = cptr;
                            // SAFETY: the caller checked the kernel's features; asl/bs hold
                            // steps*MR / steps*NR words, bs at a 64-byte boundary of the
                            // aligned buffer (slot is a multiple of 16 words: NR is); the tile
                            // rows r0..r0+mr, columns jc+j0..+nr lie in the checked C, and no
                            // other task writes them.
                            unsafe {
                                K::kernel(
                                    steps,
                                    asl.as_ptr(),
                                    bs.as_ptr(),
                                    cp.0.add(r0 * ldc + jc + j0),
                                    ldc,
                                    mr,
                                    nr,
                                    e,
                                )
                            };
                        }
                    }
                }
                put_buf(&A_BUF, abuf);
            };
            let ntasks = sp.m_blocks * sp.n_groups;
            if threads > 1 && ntasks > 1 {
                (0..ntasks).into_par_iter().for_each(task);
            } else {
                (0..ntasks).for_each(task);
            }
        }
    }
    put_buf(&B_BUF, bbuf);
}
