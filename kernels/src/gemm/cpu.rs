//! CPU GEMM: f32 on faer's `gemm` crate, bf16 on our AVX512-BF16 kernel or the portable path
//! (operands widened to f32 in reused buffers, then the f32 GEMM).
//!
//! Callers (mod.rs) have already checked every slice against the dims, so the raw-pointer
//! calls below stay inside the slices.

use super::{Dims, Trans};
use cannon_runtime::Float;
use rayon::prelude::*;
use std::cell::Cell;

/// Below this many multiply-adds a product runs on the calling thread: waking the pool costs
/// more than it saves (measured: a 64^3 product takes ~10 us single-threaded).
const PARALLEL_MIN_MACS: usize = 64 * 64 * 64;

/// Rounds an f32 to the nearest bf16 (ties to even), keeping NaN a NaN; the bits of the result.
/// Bit-identical to `half::bf16::from_f32` but branch-free, so packing loops vectorise.
#[inline(always)]
pub fn to_bf16_bits(x: f32) -> u16 {
    cannon_runtime::dtype::f32_to_bf16(x).to_bits()
}

/// Whether this CPU runs the packed `vdpbf16ps` kernel (else bf16 GEMM takes the portable path).
pub fn bf16_kernel_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::x86_bf16::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn parallelism(d: Dims) -> gemm::Parallelism {
    if d.m.saturating_mul(d.n).saturating_mul(d.k) < PARALLEL_MIN_MACS {
        gemm::Parallelism::None
    } else {
        gemm::Parallelism::Rayon(rayon::current_num_threads())
    }
}

/// `C = beta * C` (the whole product when k == 0), with beta == 0 writing zeros.
fn scale_c(d: Dims, beta: f32, c: &mut [f32], ldc: usize) {
    for i in 0..d.m {
        let row = &mut c[i * ldc..i * ldc + d.n];
        if beta == 0.0 {
            row.fill(0.0);
        } else if beta != 1.0 {
            row.iter_mut().for_each(|x| *x *= beta);
        }
    }
}

/// (row stride, column stride) of `op(X)` for a row-major X with row stride `ld`.
fn op_strides(t: Trans, ld: usize) -> (isize, isize) {
    match t {
        Trans::N => (ld as isize, 1),
        Trans::T => (1, ld as isize),
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_f32(
    ta: Trans,
    tb: Trans,
    d: Dims,
    alpha: f32,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
) {
    if d.m == 0 || d.n == 0 {
        return;
    }
    if d.k == 0 || alpha == 0.0 {
        scale_c(d, beta, c, ldc);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if super::x86_f32::wins(ta == Trans::T, tb == Trans::T, d) {
        let parallel = d.m.saturating_mul(d.n).saturating_mul(d.k) >= PARALLEL_MIN_MACS;
        super::x86_f32::gemm_tn(d, alpha, a, lda, b, ldb, beta, c, ldc, parallel);
        return;
    }
    let (a_rs, a_cs) = op_strides(ta, lda);
    let (b_rs, b_cs) = op_strides(tb, ldb);
    // SAFETY: mod.rs checked that a, b and c hold the strided [m,k], [k,n], [m,n] operands, so
    // every index gemm forms from (dims, strides) is in bounds; c is a unique borrow, so dst
    // aliases neither input. Note the crate's naming: dst = alpha*dst + beta*lhs*rhs, so our
    // beta is its alpha and our alpha its beta; read_dst=false makes it ignore old C (beta==0).
    unsafe {
        gemm::gemm(
            d.m,
            d.n,
            d.k,
            c.as_mut_ptr(),
            1,
            ldc as isize,
            beta != 0.0,
            a.as_ptr(),
            a_cs,
            a_rs,
            b.as_ptr(),
            b_cs,
            b_rs,
            beta,
            alpha,
            false,
            false,
            false,
            parallelism(d),
        );
    }
}

/// Below this many elements an operand is widened on the calling thread.
const PARALLEL_MIN_WIDEN: usize = 1 << 16;

/// Widened f32 values the portable bf16 path holds for one product (16 MiB): a larger
/// product runs in blocks (see [`portable`]). Widening whole operands made the bench
/// config's lm_head backward hold its 256 MiB `d logits` a second time, widened, in a
/// buffer kept for the next step.
pub(super) const WIDEN_CAP: usize = 1 << 22;

thread_local! {
    // The widened operands of the portable bf16 path, reused from call to call: a fresh
    // allocation per product would page-fault its whole size in every step (the bench's
    // lm_head operand alone is 64 MiB). Taken out while in use, so a product that starts on
    // this thread meanwhile (rayon work stealing) allocates its own.
    static WIDE_A: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    static WIDE_B: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// The stored matrix `[rows, cols]` (row stride `ld`) rounded to bf16 and widened back to f32,
/// densely (row stride `cols`) into `out`. It keeps the stored layout, so the copy is one
/// front-to-back stream per row (a transposed operand stays transposed and the f32 GEMM reads
/// it through its strides), split over the thread pool by rows when large.
fn widen_stored<T: Float>(rows: usize, cols: usize, x: &[T], ld: usize, out: &mut Vec<f32>) {
    // Every element is written below: only a grown tail needs initialising.
    out.resize(rows * cols, 0.0);
    let row = |i: usize, dst: &mut [f32]| {
        for (o, v) in dst.iter_mut().zip(&x[i * ld..i * ld + cols]) {
            *o = f32::from_bits((v.bf16_bits() as u32) << 16);
        }
    };
    if cols == 0 {
        return;
    }
    if rows * cols < PARALLEL_MIN_WIDEN {
        out.chunks_mut(cols)
            .enumerate()
            .for_each(|(i, d)| row(i, d));
    } else {
        out.par_chunks_mut(cols)
            .enumerate()
            .for_each(|(i, d)| row(i, d));
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_bf16<TA: Float, TB: Float>(
    ta: Trans,
    tb: Trans,
    d: Dims,
    alpha: f32,
    a: &[TA],
    lda: usize,
    b: &[TB],
    ldb: usize,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
    force_portable: bool,
) {
    if d.m == 0 || d.n == 0 {
        return;
    }
    if d.k == 0 || alpha == 0.0 {
        scale_c(d, beta, c, ldc);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if !force_portable && super::x86_bf16::available() {
        let parallel = d.m.saturating_mul(d.n).saturating_mul(d.k) >= PARALLEL_MIN_MACS;
        super::x86_bf16::gemm(ta, tb, d, alpha, a, lda, b, ldb, beta, c, ldc, parallel);
        return;
    }
    let _ = force_portable;
    let ops = (a, lda, b, ldb, c, ldc);
    portable(ta, tb, d, alpha, beta, ops, WIDEN_CAP);
}

/// The portable bf16 product: the bf16-rounded operands widened to f32, then [`gemm_f32`](super::host::gemm_f32):
/// what the bf16 kernel computes (products of bf16 values accumulated in f32) at the f32
/// GEMM's rate (widening is O(mk + kn) against the product's O(mnk)).
///
/// At most `cap` widened values are held: when `op(A)` and `op(B)` together hold more, the
/// product runs in blocks, widening the small operand once: blocks of C's rows when `op(B)`
/// is small (the lm_head's weight gradient, `d logits^T x`), of C's columns when `op(A)` is
/// (the logits, `x W^T`), and otherwise of the depth, accumulating into C (the lm_head's
/// input gradient, `d logits W`).
pub(super) fn portable<TA: Float, TB: Float>(
    ta: Trans,
    tb: Trans,
    d: Dims,
    alpha: f32,
    beta: f32,
    (a, lda, b, ldb, c, ldc): (&[TA], usize, &[TB], usize, &mut [f32], usize),
    cap: usize,
) {
    let mut aw = WIDE_A.with(|c| c.take());
    let mut bw = WIDE_B.with(|c| c.take());
    let (a_len, b_len) = (d.m * d.k, d.k * d.n);
    let half = (cap / 2).max(1);
    // Stored (rows, cols) of `op(X)`'s block and its offset in X's slice: `op(A)` rows
    // `i0..i0 + mi`, columns (depth) `p0..p0 + kp`; `op(B)` rows `p0..`, columns `j0..`.
    let a_block = |i0: usize, mi: usize, p0: usize, kp: usize| match ta {
        Trans::N => (mi, kp, i0 * lda + p0),
        Trans::T => (kp, mi, p0 * lda + i0),
    };
    let b_block = |p0: usize, kp: usize, j0: usize, nj: usize| match tb {
        Trans::N => (kp, nj, p0 * ldb + j0),
        Trans::T => (nj, kp, j0 * ldb + p0),
    };
    let whole = a_len + b_len <= cap;
    if whole || b_len <= half {
        // A product that fits is one block of all of C's rows.
        let (br, bc, _) = b_block(0, d.k, 0, d.n);
        widen_stored(br, bc, b, ldb, &mut bw);
        let rows = if whole { d.m } else { (half / d.k).max(1) };
        for i0 in (0..d.m).step_by(rows) {
            let mi = rows.min(d.m - i0);
            let (ar, ac, off) = a_block(i0, mi, 0, d.k);
            widen_stored(ar, ac, &a[off..], lda, &mut aw);
            let di = Dims { m: mi, ..d };
            let ci = &mut c[i0 * ldc..];
            gemm_f32(ta, tb, di, alpha, &aw, ac, &bw, bc, beta, ci, ldc);
        }
    } else if a_len <= half {
        let (ar, ac, _) = a_block(0, d.m, 0, d.k);
        widen_stored(ar, ac, a, lda, &mut aw);
        let cols = (half / d.k).max(1);
        for j0 in (0..d.n).step_by(cols) {
            let nj = cols.min(d.n - j0);
            let (br, bc, off) = b_block(0, d.k, j0, nj);
            widen_stored(br, bc, &b[off..], ldb, &mut bw);
            let dj = Dims { n: nj, ..d };
            let cj = &mut c[j0..];
            gemm_f32(ta, tb, dj, alpha, &aw, ac, &bw, bc, beta, cj, ldc);
        }
    } else {
        let depth = (cap / (d.m + d.n)).max(1);
        for p0 in (0..d.k).step_by(depth) {
            let kp = depth.min(d.k - p0);
            let (ar, ac, a_off) = a_block(0, d.m, p0, kp);
            let (br, bc, b_off) = b_block(p0, kp, 0, d.n);
            widen_stored(ar, ac, &a[a_off..], lda, &mut aw);
            widen_stored(br, bc, &b[b_off..], ldb, &mut bw);
            // The first block applies beta (0 ignores C's old values); the others add.
            let beta = if p0 == 0 { beta } else { 1.0 };
            let dp = Dims { k: kp, ..d };
            gemm_f32(ta, tb, dp, alpha, &aw, ac, &bw, bc, beta, c, ldc);
        }
    }
    WIDE_A.with(|c| c.set(aw));
    WIDE_B.with(|c| c.set(bw));
}
