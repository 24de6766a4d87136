//! What the two packed AVX-512 kernels (x86_bf16.rs, x86_f32.rs) share: aligned per-thread
//! packing buffers, the split of C's rows into tasks, the raw C pointer of disjoint tiles and
//! the `alpha * acc + beta * C` epilogue of a register tile.

use std::arch::x86_64::*;
use std::cell::Cell;

/// One cache line of packed 32-bit words (bf16 pairs or f32 values); packed buffers are made
/// of these so they are 64-byte aligned.
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

/// The lines as contiguous f32 values (every bit pattern is a valid f32).
pub(super) fn floats(v: &mut [Line]) -> &mut [f32] {
    let len = v.len() * 16;
    // SAFETY: as in `words`; u32 and f32 have the same size and alignment.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<f32>(), len) }
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
