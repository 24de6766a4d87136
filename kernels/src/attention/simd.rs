//! Auto-vectorised building blocks of the fused attention: a register-blocked micro-GEMM and a
//! branch-free `exp2`.
//!
//! Everything here is plain safe Rust written so that LLVM vectorises it (fixed-size inner
//! loops over lanes, lane-wise accumulators, selects instead of branches). The functions are
//! `#[inline(always)]` so that they are compiled inside the `#[target_feature]` entry points of
//! `cpu.rs` with AVX-512 / AVX2+FMA enabled; the same code is the portable fallback.
//!
//! `FMA` selects `mul_add` (one fused instruction when the caller enabled `fma`) or `a * b + c`
//! (never a libm call on machines without FMA).

use cannon_runtime::Float;

/// Rows of the micro-kernel's register block.
/// (The micro-kernel below unrolls exactly 4 rows.)
pub(super) const MR: usize = 4;
/// Narrow column chunk: one AVX-512 vector, two AVX2 vectors. Every padded width (key block,
/// padded head_dim) is a multiple of it.
pub(super) const NR: usize = 16;
/// Keys per block of the online softmax (and rows of the dK/dV blocks in backward).
pub(super) const KB: usize = 64;
/// Target rows (tokens x heads of a group) of a query tile.
pub(super) const QROWS: usize = 64;

#[inline(always)]
pub(super) fn fmadd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// How the micro-kernel reads `A(r, p)`, r < MR, p < kc, from `a` with leading dimension `lda`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ALayout {
    /// `A(r, p) = a[r * lda + p]` (a row-major tile: Q, P, dS).
    Rows,
    /// `A(r, p) = a[p * lda + r]` (the transpose of a row-major tile: P^T, dS^T).
    Cols,
}

/// `C[MR, NC] (+)= A[MR, kc] B[kc, NC]`, accumulators in registers.
///
/// `B(p, j) = b[p * ldb + j]`, `C(r, j) = c[r * ldc + j]`; with `ACC = false` C is overwritten.
/// The summation over p runs in ascending order, one fused step per p, so a row of C depends
/// only on its own row of A (never on which rows share the register block).
#[inline(always)]
#[allow(clippy::too_many_arguments)] // a BLAS-style micro-kernel: the strides are the interface
fn micro<const FMA: bool, const NC: usize, const ACC: bool>(
    kc: usize,
    al: ALayout,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
) {
    let mut acc = [[0.0f32; NC]; MR];
    if ACC {
        for (r, row) in acc.iter_mut().enumerate() {
            row.copy_from_slice(&c[r * ldc..][..NC]);
        }
    }
    // The common depth (head_dim 64, a full key block, a full 64-row tile) as a constant trip
    // count: the loop is unrolled and its bounds checks hoisted. Same steps in the same order.
    if kc == KB {
        micro_steps::<FMA, NC>(KB, al, a, lda, b, ldb, &mut acc);
    } else {
        micro_steps::<FMA, NC>(kc, al, a, lda, b, ldb, &mut acc);
    }
    for (r, row) in acc.iter().enumerate() {
        c[r * ldc..][..NC].copy_from_slice(row);
    }
}

/// The `kc` fused steps of [`micro`] on the accumulators.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // see `micro`
fn micro_steps<const FMA: bool, const NC: usize>(
    kc: usize,
    al: ALayout,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    acc: &mut [[f32; NC]; MR],
) {
    // No closures or `array::from_fn` here: they are separate functions that the compiler may
    // leave outlined, i.e. compiled without the caller's target features. B's row is loaded
    // BEFORE the A values: a scalar load that precedes the copy cannot be folded into a
    // load-port broadcast (`vbroadcastss zmm, m32`) and costs a shuffle on the FMA pipes.
    match al {
        ALayout::Rows => {
            // Slicing each row to kc once lets the loop index them without checks.
            let (r0, r1, r2, r3) = (
                &a[..kc],
                &a[lda..][..kc],
                &a[2 * lda..][..kc],
                &a[3 * lda..][..kc],
            );
            for p in 0..kc {
                let bv = load_b::<NC>(&b[p * ldb..]);
                fma_rows::<FMA, NC>(acc, &bv, [r0[p], r1[p], r2[p], r3[p]]);
            }
        }
        ALayout::Cols => {
            for p in 0..kc {
                let bv = load_b::<NC>(&b[p * ldb..]);
                let col = &a[p * lda..][..MR];
                fma_rows::<FMA, NC>(acc, &bv, [col[0], col[1], col[2], col[3]]);
            }
        }
    }
}

/// One row of B, `[NC]`, into registers.
#[inline(always)]
fn load_b<const NC: usize>(brow: &[f32]) -> [f32; NC] {
    let mut bv = [0.0f32; NC];
    bv.copy_from_slice(&brow[..NC]);
    bv
}

/// One fused step of the micro-kernel: `acc[r][:] += ap[r] * bv[:]`.
#[inline(always)]
fn fma_rows<const FMA: bool, const NC: usize>(
    acc: &mut [[f32; NC]; MR],
    bv: &[f32; NC],
    ap: [f32; MR],
) {
    for (row, &av) in acc.iter_mut().zip(&ap) {
        for j in 0..NC {
            row[j] = fmadd::<FMA>(av, bv[j], row[j]);
        }
    }
}

/// `C[MR, n] (+)= A[MR, kc] B[kc, n]` for `n` a multiple of [`NR`]: chunks of `W` columns (the
/// widest register block of the ISA), then chunks of [`NR`].
#[inline(always)]
#[allow(clippy::too_many_arguments)] // see `micro`
pub(super) fn panel<const FMA: bool, const W: usize, const ACC: bool>(
    kc: usize,
    n: usize,
    al: ALayout,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
) {
    debug_assert_eq!(n % NR, 0);
    let mut j = 0;
    if W > NR {
        while j + W <= n {
            micro::<FMA, W, ACC>(kc, al, a, lda, &b[j..], ldb, &mut c[j..], ldc);
            j += W;
        }
    }
    if W > 2 * NR && j + 2 * NR <= n {
        micro::<FMA, { 2 * NR }, ACC>(kc, al, a, lda, &b[j..], ldb, &mut c[j..], ldc);
        j += 2 * NR;
    }
    while j < n {
        micro::<FMA, NR, ACC>(kc, al, a, lda, &b[j..], ldb, &mut c[j..], ldc);
        j += NR;
    }
}

/// The column chunks `(start, width)` that [`panel`] splits `n` columns into, in its order:
/// calling `panel` on one chunk runs exactly that chunk's micro-kernel. Lets a caller put the
/// column loop outside its row loop (reusing one chunk of B across many row panels) with the
/// same micro-kernel calls, hence the same bits.
#[inline(always)]
pub(super) fn col_chunks<const W: usize>(n: usize) -> impl Iterator<Item = (usize, usize)> {
    let wide = if W > NR { n / W } else { 0 };
    let j = wide * W;
    let mid = W > 2 * NR && j + 2 * NR <= n;
    let j2 = if mid { j + 2 * NR } else { j };
    (0..wide)
        .map(|c| (c * W, W))
        .chain(mid.then_some((j, 2 * NR)))
        .chain((j2..n).step_by(NR).map(|j| (j, NR)))
}

/// 1.5 * 2^23: adding it to an f32 of magnitude < 2^22 rounds it to an integer held in the low
/// mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;
/// ROUND_MAGIC + 127 (exact): the rounded integer comes out with the exponent bias added.
const ROUND_MAGIC_BIASED: f32 = 12_583_039.0;

/// `2^x`, branch-free: `x = n + f`, `n = round(x)`, `|f| <= 1/2`, `2^f` by the degree-6
/// polynomial of Cephes' `exp2f` (relative error ~1e-7), `2^n` by building the exponent bits. Returns exactly 0 for `x < -126` (masked scores are
/// -inf) and propagates NaN; `x` is clamped above at 127.
#[inline(always)]
pub(super) fn exp2<const FMA: bool>(x: f32) -> f32 {
    // `if`, not `min`: keeps NaN. Below -126 the bits are garbage, replaced by the final select.
    let xc = if x > 127.0 { 127.0 } else { x };
    let t = xc + ROUND_MAGIC_BIASED;
    let f = xc - (t - ROUND_MAGIC_BIASED);
    let biased = (t.to_bits() as i32).wrapping_sub(ROUND_MAGIC.to_bits() as i32);
    let mut p = 1.535_336_2e-4f32;
    p = fmadd::<FMA>(p, f, 1.339_887_4e-3);
    p = fmadd::<FMA>(p, f, 9.618_437e-3);
    p = fmadd::<FMA>(p, f, 5.550_332_5e-2);
    p = fmadd::<FMA>(p, f, 2.402_264_8e-1);
    p = fmadd::<FMA>(p, f, 6.931_472e-1);
    p = fmadd::<FMA>(p, f, 1.0);
    let r = p * f32::from_bits((biased << 23) as u32);
    // NaN passes through the polynomial, and `NaN < -126` is false.
    if x < -126.0 {
        0.0
    } else {
        r
    }
}

/// Pairwise sum of the lanes (a log-depth shuffle tree, not a serial chain).
#[inline(always)]
fn tree_sum(mut lanes: [f32; NR]) -> f32 {
    let mut w = NR / 2;
    while w > 0 {
        for l in 0..w {
            lanes[l] += lanes[l + w];
        }
        w /= 2;
    }
    lanes[0]
}

/// `sum(a * b)` over equal-length slices of any element type, widened to f32: lane
/// accumulators in a fixed order, then the tail.
#[inline]
pub(super) fn dot<A: Float, B: Float>(a: &[A], b: &[B]) -> f32 {
    let mut lanes = [0.0f32; NR];
    let (ac, bc) = (a.chunks_exact(NR), b.chunks_exact(NR));
    let (at, bt) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..NR {
            lanes[l] += x[l].to_f32() * y[l].to_f32();
        }
    }
    let mut s = tree_sum(lanes);
    for (&x, &y) in at.iter().zip(bt) {
        s += x.to_f32() * y.to_f32();
    }
    s
}

/// Lanes of the row kernels' accumulators: one AVX-512 vector, two AVX2 vectors. (The row
/// kernels take the `W` of `cpu::isa_dispatch!`'s entry points but need no column width.)
const RL: usize = 16;

/// The softmax numerators of score rows in place, `x = e^(x - max)` (a masked -inf score
/// gives exactly 0), over the first `n` rows of `s` (`m` wide); pushes `(max + ln sum, sum)`
/// per row onto `stats`.
#[inline(always)]
pub(super) fn softmax_rows<const FMA: bool, const W: usize>(
    s: &mut [f32],
    m: usize,
    n: usize,
    stats: &mut Vec<(f32, f32)>,
) {
    let log2e = std::f32::consts::LOG2_E;
    for row in s.chunks_mut(m.max(1)).take(n) {
        let mut lanes = [f32::NEG_INFINITY; RL];
        let mut it = row.chunks_exact(RL);
        for c in &mut it {
            for i in 0..RL {
                lanes[i] = if c[i] > lanes[i] { c[i] } else { lanes[i] };
            }
        }
        let mx = it
            .remainder()
            .iter()
            .chain(&lanes)
            .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
        let bias = -mx * log2e;
        let mut sum = [0.0f32; RL];
        let mut it = row.chunks_exact_mut(RL);
        for c in &mut it {
            for i in 0..RL {
                c[i] = exp2::<FMA>(fmadd::<FMA>(c[i], log2e, bias));
                sum[i] += c[i];
            }
        }
        let mut l = tree_sum(sum);
        for x in it.into_remainder() {
            *x = exp2::<FMA>(fmadd::<FMA>(*x, log2e, bias));
            l += *x;
        }
        stats.push((mx + l.ln(), l));
    }
}

/// The backward's probabilities and score gradients over the first `n` rows (`m` wide):
/// `p = e^(p - lse_r)` from the scores in `p`, `ds = p (ds - di_r)` from `dout . v` in `ds`,
/// with row `r`'s statistics at `lse[r * stride]`, `di[r * stride]`. A row with no keys
/// (`lse = -inf`) gets zeros.
#[inline(always)]
pub(super) fn probs_grads_rows<const FMA: bool, const W: usize>(
    p: &mut [f32],
    ds: &mut [f32],
    (m, n): (usize, usize),
    lse: &[f32],
    di: &[f32],
    stride: usize,
) {
    let log2e = std::f32::consts::LOG2_E;
    let rows = p.chunks_mut(m.max(1)).zip(ds.chunks_mut(m.max(1)));
    for (r, (prow, drow)) in rows.take(n).enumerate() {
        let (l, d) = (lse[r * stride], di[r * stride]);
        if l == f32::NEG_INFINITY {
            prow.fill(0.0);
            drow.fill(0.0);
            continue;
        }
        let bias = -l * log2e;
        for (x, y) in prow.iter_mut().zip(drow.iter_mut()) {
            *x = exp2::<FMA>(fmadd::<FMA>(*x, log2e, bias));
            *y = *x * (*y - d);
        }
    }
}
