//! CPU GEMM: f32 on faer's `gemm` crate, bf16 on our AVX512-BF16 kernel or the portable path.
//!
//! Callers (mod.rs) have already checked every slice against the dims, so the raw-pointer
//! calls below stay inside the slices.

use super::{Bf16Elem, Dims, Trans};

/// Below this many multiply-adds a product runs on the calling thread: waking the pool costs
/// more than it saves (measured: a 64^3 product takes ~10 us single-threaded).
const PARALLEL_MIN_MACS: usize = 64 * 64 * 64;

/// Rounds an f32 to the nearest bf16 (ties to even), keeping NaN a NaN; the bits of the result.
/// Bit-identical to `half::bf16::from_f32` but branch-free, so packing loops vectorise.
#[inline(always)]
pub fn to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    // A NaN must stay NaN even if rounding would carry its payload into the exponent/infinity.
    let quiet_nan = ((b >> 16) as u16) | 0x0040;
    if x.is_nan() {
        quiet_nan
    } else {
        rounded
    }
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
    if ta == Trans::T && d.m >= AT_TILE_MIN_M {
        gemm_f32_at_tiled(tb, d, alpha, a, lda, b, ldb, beta, c, ldc);
    } else {
        gemm_f32_direct(ta, tb, d, alpha, a, lda, b, ldb, beta, c, ldc);
    }
}

/// Rows of `op(A)` per tile when A is transposed and m is large (see [`gemm_f32_at_tiled`]).
const AT_TILE_M: usize = 1024;
/// Pad of the tile's row stride, in floats: 64 bytes, so rows stay cache-line aligned but the
/// stride is no longer a power of two.
const AT_TILE_PAD: usize = 16;
/// Depth per tile: bounds the scratch at `AT_TILE_K * (AT_TILE_M + AT_TILE_PAD)` floats (4 MiB,
/// so a tile is still in L3 when faer packs it; measured ~1-2 % faster than one 2048-deep tile).
const AT_TILE_K: usize = 1024;
/// Only the head's dW (m = vocab) is slow untiled; mlp dW (m = 1536) runs at full rate as is.
const AT_TILE_MIN_M: usize = 4 * AT_TILE_M;

/// `op(A) = A^T` with large m: `C[i0.., :] (+)= A[p0.., i0..]^T B[p0.., :]` tile by tile, each
/// A tile first copied into a contiguous scratch with a padded stride.
///
/// Why: faer runs this as `C^T = op(B)^T A` and packs A's stored rows, `lda` floats apart. For
/// dY [tokens, vocab=32768] that stride is 128 KiB, so every row of a packing panel maps to
/// the same L1/L2 set and the lines thrash (head dW ran at ~85 % of the square rate). The
/// copy reads each row contiguously and costs one extra pass over A (~4 % of the product).
#[allow(clippy::too_many_arguments)]
fn gemm_f32_at_tiled(
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
    use rayon::prelude::*;
    // Rows of scratch each rayon task copies (256 KiB): few tasks, each a long stream.
    const COPY_ROWS: usize = 64;
    let ld = AT_TILE_M + AT_TILE_PAD;
    let mut scratch = vec![0.0f32; d.k.min(AT_TILE_K) * ld];
    for i0 in (0..d.m).step_by(AT_TILE_M) {
        let rows = AT_TILE_M.min(d.m - i0);
        for p0 in (0..d.k).step_by(AT_TILE_K) {
            let depth = AT_TILE_K.min(d.k - p0);
            // scratch[p, 0..rows] = A[p0 + p, i0..i0 + rows]   (= op(A) tile, transposed)
            scratch[..depth * ld]
                .par_chunks_mut(COPY_ROWS * ld)
                .enumerate()
                .for_each(|(t, chunk)| {
                    for (r, dst) in chunk.chunks_mut(ld).enumerate() {
                        let src = (p0 + t * COPY_ROWS + r) * lda + i0;
                        dst[..rows].copy_from_slice(&a[src..src + rows]);
                    }
                });
            let b_tile = match tb {
                Trans::N => &b[p0 * ldb..],
                Trans::T => &b[p0..],
            };
            // Later depth tiles add onto what the first one wrote.
            let beta_tile = if p0 == 0 { beta } else { 1.0 };
            let tile = Dims {
                m: rows,
                n: d.n,
                k: depth,
            };
            gemm_f32_direct(
                Trans::T,
                tb,
                tile,
                alpha,
                &scratch,
                ld,
                b_tile,
                ldb,
                beta_tile,
                &mut c[i0 * ldc..],
                ldc,
            );
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn gemm_f32_direct(
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

/// Copies `op(X)` (`[rows, cols]`) rounded to bf16 and widened back to f32 into a dense matrix.
fn widen_op<T: Bf16Elem>(t: Trans, rows: usize, cols: usize, x: &[T], ld: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * cols);
    for i in 0..rows {
        for j in 0..cols {
            let v = match t {
                Trans::N => x[i * ld + j],
                Trans::T => x[j * ld + i],
            };
            out.push(f32::from_bits((v.bf16_bits() as u32) << 16));
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_bf16<TA: Bf16Elem, TB: Bf16Elem>(
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
    let aw = widen_op(ta, d.m, d.k, a, lda);
    let bw = widen_op(tb, d.k, d.n, b, ldb);
    gemm_f32(
        Trans::N,
        Trans::N,
        d,
        alpha,
        &aw,
        d.k,
        &bw,
        d.n,
        beta,
        c,
        ldc,
    );
}

#[cfg(test)]
mod tests {
    use super::super::{gemm_f32, Dims, Trans};
    use super::{AT_TILE_K, AT_TILE_M, AT_TILE_MIN_M};
    use crate::testutil::{rel_l2, Rng};

    /// The tiled `A^T` path against a float64 triple loop: m past AT_TILE_MIN_M with a ragged
    /// last row tile, k past AT_TILE_K (so a second depth tile accumulates), a padded lda and a
    /// strided C window, for beta = 1 (how dW accumulates) and beta = 0 over a NaN-filled C.
    /// n is tiny to keep the f64 reference fast. Tolerance 1e-5: f32 sums over ~4100 terms.
    #[test]
    fn f32_transposed_a_tiles_match_f64_reference() {
        let d = Dims {
            m: AT_TILE_MIN_M.max(AT_TILE_M) + 7,
            n: 3,
            k: AT_TILE_K + 5,
        };
        let (lda, ldc) = (d.m + 9, d.n + 2);
        let mut rng = Rng::new(5);
        let a = rng.normal_vec(d.k * lda, 1.0);
        for tb in [Trans::N, Trans::T] {
            let ldb = match tb {
                Trans::N => d.n + 1,
                Trans::T => d.k + 1,
            };
            let b = rng.normal_vec(ldb * d.k.max(d.n), 1.0);
            let bat = |p: usize, j: usize| match tb {
                Trans::N => b[p * ldb + j],
                Trans::T => b[j * ldb + p],
            };
            for beta in [1.0f32, 0.0] {
                let c0 = if beta == 0.0 {
                    vec![f32::NAN; d.m * ldc]
                } else {
                    rng.normal_vec(d.m * ldc, 1.0)
                };
                let mut want: Vec<f64> = c0.iter().map(|&x| x as f64).collect();
                for i in 0..d.m {
                    for j in 0..d.n {
                        let dot: f64 = (0..d.k)
                            .map(|p| a[p * lda + i] as f64 * bat(p, j) as f64)
                            .sum();
                        let old = if beta == 0.0 {
                            0.0
                        } else {
                            c0[i * ldc + j] as f64
                        };
                        want[i * ldc + j] = 0.5 * dot + old;
                    }
                }
                let mut c = c0.clone();
                gemm_f32(Trans::T, tb, d, 0.5, &a, lda, &b, ldb, beta, &mut c, ldc).unwrap();
                // Columns n..ldc of each row lie outside the window and must be untouched.
                let (got, exp): (Vec<f32>, Vec<f64>) = (0..d.m)
                    .flat_map(|i| (0..d.n).map(move |j| i * ldc + j))
                    .map(|ix| (c[ix], want[ix]))
                    .unzip();
                let e = rel_l2(&got, &exp);
                assert!(e <= 1e-5, "{tb:?} beta {beta}: rel_l2 {e:e}");
                for i in 0..d.m {
                    for j in d.n..ldc {
                        let (x, y) = (c[i * ldc + j], c0[i * ldc + j]);
                        assert!(x.to_bits() == y.to_bits(), "pad ({i},{j}) written");
                    }
                }
            }
        }
    }
}
