//! GEMM against a naive float64 triple loop, on shapes that hit every edge of the blocking:
//! size 1, odd k (a half-filled k-pair), m/n not multiples of the 14 x 32 tile or of 16 lanes,
//! strided operands, and sizes past the KC / MC / NC block limits.

use super::host::{gemm_bf16, gemm_bf16_portable, gemm_f32};
use super::*;
use crate::testutil::{rel_l2, Rng};
use half::bf16;
use rayon::prelude::*;

/// `op(X)[r][c]` of a row-major stored matrix.
fn at(t: Trans, x: &[f64], ld: usize, r: usize, c: usize) -> f64 {
    match t {
        Trans::N => x[r * ld + c],
        Trans::T => x[c * ld + r],
    }
}

/// Naive `alpha * op(A) op(B) + beta * C` in float64 (beta == 0: C ignored).
#[allow(clippy::too_many_arguments)]
fn reference(
    ta: Trans,
    tb: Trans,
    d: Dims,
    alpha: f64,
    a: &[f64],
    lda: usize,
    b: &[f64],
    ldb: usize,
    beta: f64,
    c: &[f64],
    ldc: usize,
) -> Vec<f64> {
    let mut out = c.to_vec();
    for i in 0..d.m {
        for j in 0..d.n {
            let dot: f64 = (0..d.k)
                .map(|p| at(ta, a, lda, i, p) * at(tb, b, ldb, p, j))
                .sum();
            let old = if beta == 0.0 {
                0.0
            } else {
                beta * c[i * ldc + j]
            };
            out[i * ldc + j] = alpha * dot + old;
        }
    }
    out
}

/// A random case: stored operands with row strides padded by `pad` (0 = dense).
struct Case {
    ta: Trans,
    tb: Trans,
    d: Dims,
    a: Vec<f32>,
    lda: usize,
    b: Vec<f32>,
    ldb: usize,
    c: Vec<f32>,
    ldc: usize,
}

fn case(rng: &mut Rng, ta: Trans, tb: Trans, d: Dims, pad: usize) -> Case {
    let (ar, ac) = stored_shape(ta, d.m, d.k);
    let (br, bc) = stored_shape(tb, d.k, d.n);
    let (lda, ldb, ldc) = (ac + pad, bc + pad, d.n + pad);
    Case {
        ta,
        tb,
        d,
        a: rng.normal_vec(strided_len(ar, ac, lda), 1.0),
        lda,
        b: rng.normal_vec(strided_len(br, bc, ldb), 1.0),
        ldb,
        c: rng.normal_vec(strided_len(d.m, d.n, ldc), 1.0),
        ldc,
    }
}

fn f64s(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

fn bf16s(x: &[f32]) -> Vec<bf16> {
    x.iter().map(|&v| bf16::from_f32(v)).collect()
}

fn rounded_f64s(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| bf16::from_f32(v).to_f64()).collect()
}

const TRANS: [(Trans, Trans); 4] = [
    (Trans::N, Trans::N),
    (Trans::N, Trans::T),
    (Trans::T, Trans::N),
    (Trans::T, Trans::T),
];

/// Small and awkward dims: 1, odd, just under / over the 14-row and 16/32-column tiles.
fn small_dims(rng: &mut Rng) -> Vec<Dims> {
    let mut v = vec![
        Dims { m: 1, n: 1, k: 1 },
        Dims { m: 1, n: 17, k: 3 },
        Dims { m: 15, n: 1, k: 2 },
        Dims {
            m: 14,
            n: 32,
            k: 64,
        },
        Dims {
            m: 13,
            n: 33,
            k: 31,
        },
        Dims {
            m: 29,
            n: 47,
            k: 129,
        },
    ];
    for _ in 0..4 {
        v.push(Dims {
            m: 1 + rng.below(70),
            n: 1 + rng.below(90),
            k: 1 + rng.below(200),
        });
    }
    v
}

// f32 results carry the f32 rounding of k-term sums (~sqrt(k) * 6e-8 relative): 1e-5 is the
// forward bar of DESIGN.md and leaves two orders of magnitude of margin.
#[test]
fn f32_matches_f64_reference_all_transposes() {
    let mut rng = Rng::new(11);
    for d in small_dims(&mut rng) {
        for (ta, tb) in TRANS {
            for (pad, alpha, beta) in [(0, 1.0, 0.0), (3, 0.5, 1.0), (1, -2.0, 0.25)] {
                let cs = case(&mut rng, ta, tb, d, pad);
                let r = reference(
                    ta,
                    tb,
                    d,
                    alpha as f64,
                    &f64s(&cs.a),
                    cs.lda,
                    &f64s(&cs.b),
                    cs.ldb,
                    beta as f64,
                    &f64s(&cs.c),
                    cs.ldc,
                );
                let mut c = cs.c.clone();
                gemm_f32(
                    ta, tb, d, alpha, &cs.a, cs.lda, &cs.b, cs.ldb, beta, &mut c, cs.ldc,
                )
                .unwrap();
                let e = rel_l2(&c, &r);
                assert!(e <= 1e-5, "{ta:?}{tb:?} {d:?} pad {pad}: rel_l2 {e:e}");
            }
        }
    }
}

/// Runs the bf16 GEMM on `cs` and checks it against float64 of the bf16-rounded inputs (the
/// kernel's own error: f32 accumulation only, so 1e-5 as for f32) and of the unrounded inputs
/// (the bf16 storage error, ~2^-9 per input: bar 0.015 of DESIGN.md).
fn check_bf16(cs: &Case, alpha: f32, beta: f32, portable: bool) -> Vec<f32> {
    let (ah, bh) = (bf16s(&cs.a), bf16s(&cs.b));
    let mut c = cs.c.clone();
    let run = if portable {
        gemm_bf16_portable::<bf16, bf16>
    } else {
        gemm_bf16::<bf16, bf16>
    };
    let (ta, tb, d) = (cs.ta, cs.tb, cs.d);
    run(
        ta, tb, d, alpha, &ah, cs.lda, &bh, cs.ldb, beta, &mut c, cs.ldc,
    )
    .unwrap();
    let c64 = f64s(&cs.c);
    let (alpha, beta) = (alpha as f64, beta as f64);
    let (ra, rb) = (rounded_f64s(&cs.a), rounded_f64s(&cs.b));
    let r = reference(
        ta, tb, d, alpha, &ra, cs.lda, &rb, cs.ldb, beta, &c64, cs.ldc,
    );
    let e = rel_l2(&c, &r);
    assert!(
        e <= 1e-5,
        "{ta:?}{tb:?} {d:?} vs rounded inputs: rel_l2 {e:e}"
    );
    // The storage bar is a statistic over a tensor: a lone element (m*n tiny) that is a sum
    // with cancellation can lose more than 1.5 %, so it applies from 100 outputs on.
    if d.m * d.n >= 100 {
        let (fa, fb) = (f64s(&cs.a), f64s(&cs.b));
        let r = reference(
            ta, tb, d, alpha, &fa, cs.lda, &fb, cs.ldb, beta, &c64, cs.ldc,
        );
        let e = rel_l2(&c, &r);
        assert!(e <= 0.015, "{ta:?}{tb:?} {d:?} vs f32 inputs: rel_l2 {e:e}");
    }
    c
}

#[test]
fn bf16_matches_f64_reference_all_transposes() {
    let mut rng = Rng::new(12);
    for d in small_dims(&mut rng) {
        for (ta, tb) in TRANS {
            for (pad, alpha, beta) in [(0, 1.0, 0.0), (5, 0.5, 1.0), (2, -1.5, 0.75)] {
                let cs = case(&mut rng, ta, tb, d, pad);
                check_bf16(&cs, alpha, beta, false);
            }
        }
    }
}

/// The AVX512-BF16 kernel and the portable fallback multiply the same rounded inputs; they may
/// only differ by f32 summation order (~sqrt(k) ulps): 1e-6 relative.
#[test]
fn bf16_kernel_matches_portable_fallback() {
    let mut rng = Rng::new(13);
    let mut dims = small_dims(&mut rng);
    dims.push(Dims {
        m: 300,
        n: 70,
        k: 1031,
    });
    for d in dims {
        for (ta, tb) in TRANS {
            let cs = case(&mut rng, ta, tb, d, 1);
            let fast = check_bf16(&cs, 1.0, 0.5, false);
            let slow = check_bf16(&cs, 1.0, 0.5, true);
            let e = rel_l2(&fast, &slow);
            assert!(
                e <= 1e-6,
                "{ta:?}{tb:?} {d:?}: fast vs portable rel_l2 {e:e}"
            );
        }
    }
}

/// Shapes past each blocking limit: k > KC (partial sums accumulate in C over k blocks, with an
/// odd tail), m > MC (several row blocks, so several tasks), n > NC (several B panels), and
/// k > KO with n > NC_DEEP (several packed depths and panels of a deep product).
#[test]
fn bf16_and_f32_across_block_boundaries() {
    let mut rng = Rng::new(14);
    let dims = [
        Dims {
            m: 300,
            n: 37,
            k: 1031,
        },
        Dims {
            m: 9,
            n: 2048 + 45,
            k: 77,
        },
        Dims {
            m: 517,
            n: 65,
            k: 513,
        },
        // k > KO (two packed B depths, odd tail) and n > NC_DEEP (two panels of a deep product).
        Dims {
            m: 20,
            n: 600,
            k: 4201,
        },
    ];
    for d in dims {
        for (ta, tb) in [(Trans::N, Trans::T), (Trans::T, Trans::N)] {
            let cs = case(&mut rng, ta, tb, d, 0);
            check_bf16(&cs, 1.0, 1.0, false);
            let mut c = cs.c.clone();
            gemm_f32(
                ta, tb, d, 1.0, &cs.a, cs.lda, &cs.b, cs.ldb, 1.0, &mut c, cs.ldc,
            )
            .unwrap();
            let r = reference(
                ta,
                tb,
                d,
                1.0,
                &f64s(&cs.a),
                cs.lda,
                &f64s(&cs.b),
                cs.ldb,
                1.0,
                &f64s(&cs.c),
                cs.ldc,
            );
            let e = rel_l2(&c, &r);
            assert!(e <= 1e-5, "f32 {ta:?}{tb:?} {d:?}: rel_l2 {e:e}");
        }
    }
}

/// `op(A) = A^T` with a long m runs on our own f32 kernel (x86_f32.rs) on AVX-512 machines:
/// through the public entry point, with padded strides, accumulate and overwrite, against the
/// float64 reference; k spans several sub-blocks (prefetch path) with a short last one.
#[test]
fn f32_transposed_a_with_long_m() {
    let mut rng = Rng::new(15);
    let d = Dims {
        m: 4100,
        n: 45,
        k: 530,
    };
    for (pad, alpha, beta) in [(0, 1.0f32, 1.0f32), (3, 0.5, 0.0)] {
        let cs = case(&mut rng, Trans::T, Trans::N, d, pad);
        let mut c = cs.c.clone();
        gemm_f32(
            Trans::T,
            Trans::N,
            d,
            alpha,
            &cs.a,
            cs.lda,
            &cs.b,
            cs.ldb,
            beta,
            &mut c,
            cs.ldc,
        )
        .unwrap();
        let r = reference(
            Trans::T,
            Trans::N,
            d,
            alpha as f64,
            &f64s(&cs.a),
            cs.lda,
            &f64s(&cs.b),
            cs.ldb,
            beta as f64,
            &f64s(&cs.c),
            cs.ldc,
        );
        let e = rel_l2(&c, &r);
        assert!(e <= 1e-5, "pad {pad} beta {beta}: rel_l2 {e:e}");
    }
}

/// f32 operands fed to the bf16 GEMM are rounded while packing (both packing orientations,
/// for A and for B): the result must be bit-equal to rounding them first with `half` (torch's
/// rounding) and passing bf16.
#[test]
fn bf16_gemm_of_f32_inputs_equals_rounding_first() {
    let mut rng = Rng::new(15);
    let d = Dims {
        m: 37,
        n: 45,
        k: 99,
    };
    for (ta, tb) in TRANS {
        let cs = case(&mut rng, ta, tb, d, 2);
        let (ah, bh) = (bf16s(&cs.a), bf16s(&cs.b));
        let (lda, ldb, ldc) = (cs.lda, cs.ldb, cs.ldc);
        let mut c1 = vec![0.0; cs.c.len()];
        let (mut c2, mut c3) = (c1.clone(), c1.clone());
        gemm_bf16(ta, tb, d, 1.0, &cs.a, lda, &bh, ldb, 0.0, &mut c1, ldc).unwrap();
        gemm_bf16(ta, tb, d, 1.0, &ah, lda, &cs.b, ldb, 0.0, &mut c2, ldc).unwrap();
        gemm_bf16(ta, tb, d, 1.0, &ah, lda, &bh, ldb, 0.0, &mut c3, ldc).unwrap();
        assert_eq!(c1, c3, "{ta:?}{tb:?}: f32 A");
        assert_eq!(c2, c3, "{ta:?}{tb:?}: f32 B");
    }
}

#[test]
fn f32_to_bf16_rounding_is_bit_identical_to_half() {
    let mut rng = Rng::new(16);
    let mut xs: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        f32::MAX,
        f32::MIN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MIN_POSITIVE,
        1e-40,
        -1e-45,
        f32::from_bits(0x3F80_8000), // tie, even below: rounds down
        f32::from_bits(0x3F81_8000), // tie, odd below: rounds up
        f32::from_bits(0x7F7F_FFFF), // rounds up to infinity
    ];
    xs.extend((0..10_000).map(|_| f32::from_bits(rng.next_u64() as u32)));
    for x in xs {
        let want = bf16::from_f32(x).to_bits();
        let got = to_bf16_bits(x);
        if x.is_nan() {
            assert!(
                bf16::from_bits(got).is_nan(),
                "{:#x} -> {got:#x}",
                x.to_bits()
            );
        } else {
            assert_eq!(got, want, "{x:e} ({:#x})", x.to_bits());
        }
    }
}

/// beta == 0 must not read C (BLAS semantics: NaN garbage in an output buffer is overwritten),
/// and k == 0 must scale C by beta.
#[test]
fn beta_zero_ignores_c_and_k_zero_scales() {
    let mut rng = Rng::new(17);
    let d = Dims {
        m: 20,
        n: 40,
        k: 33,
    };
    let cs = case(&mut rng, Trans::N, Trans::T, d, 0);
    let (ah, bh) = (bf16s(&cs.a), bf16s(&cs.b));
    let mut c1 = vec![f32::NAN; d.m * d.n];
    let mut c2 = c1.clone();
    gemm_f32(
        Trans::N,
        Trans::T,
        d,
        1.0,
        &cs.a,
        d.k,
        &cs.b,
        d.k,
        0.0,
        &mut c1,
        d.n,
    )
    .unwrap();
    gemm_bf16(
        Trans::N,
        Trans::T,
        d,
        1.0,
        &ah,
        d.k,
        &bh,
        d.k,
        0.0,
        &mut c2,
        d.n,
    )
    .unwrap();
    assert!(c1.iter().chain(&c2).all(|x| x.is_finite()));

    let d0 = Dims { m: 3, n: 4, k: 0 };
    let mut c = vec![2.0f32; 12];
    gemm_f32(Trans::N, Trans::N, d0, 1.0, &[], 0, &[], 4, 0.5, &mut c, 4).unwrap();
    assert!(c.iter().all(|&x| x == 1.0));
    gemm_bf16::<bf16, bf16>(Trans::N, Trans::N, d0, 1.0, &[], 0, &[], 4, 0.0, &mut c, 4).unwrap();
    assert!(c.iter().all(|&x| x == 0.0));
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let d = Dims { m: 4, n: 5, k: 6 };
    let (a, b, mut c) = (vec![0.0f32; 24], vec![0.0f32; 30], vec![0.0f32; 20]);
    let ok = gemm_f32(Trans::N, Trans::N, d, 1.0, &a, 6, &b, 5, 0.0, &mut c, 5);
    assert!(ok.is_ok());
    let short_a = gemm_f32(
        Trans::N,
        Trans::N,
        d,
        1.0,
        &a[..23],
        6,
        &b,
        5,
        0.0,
        &mut c,
        5,
    );
    assert!(matches!(short_a, Err(KernelError::Shape { .. })));
    // A^T is stored [k=6, m=4]: lda 6 would need 5*6+4 = 34 elements.
    let wrong_t = gemm_f32(Trans::T, Trans::N, d, 1.0, &a, 6, &b, 5, 0.0, &mut c, 5);
    assert!(matches!(wrong_t, Err(KernelError::Shape { .. })));
    let small_ld = gemm_f32(Trans::N, Trans::N, d, 1.0, &a, 5, &b, 5, 0.0, &mut c, 5);
    assert!(matches!(small_ld, Err(KernelError::Shape { .. })));
    let ah = vec![bf16::ZERO; 24];
    let short_c = gemm_bf16(
        Trans::N,
        Trans::N,
        d,
        1.0,
        &ah,
        6,
        &b,
        5,
        0.0,
        &mut c[..19],
        5,
    );
    assert!(matches!(short_c, Err(KernelError::Shape { .. })));
}

/// Products issued from inside rayon tasks (as other ops do) must not trip over the per-thread
/// packing buffers, and each must equal the same product run alone.
#[test]
fn nested_calls_from_rayon_tasks() {
    let mut rng = Rng::new(18);
    let d = Dims {
        m: 120,
        n: 96,
        k: 200,
    };
    let cases: Vec<Case> = (0..6)
        .map(|_| case(&mut rng, Trans::N, Trans::T, d, 0))
        .collect();
    let run = |cs: &Case| {
        let mut c = vec![0.0f32; d.m * d.n];
        let (ah, bh) = (bf16s(&cs.a), bf16s(&cs.b));
        gemm_bf16(
            Trans::N,
            Trans::T,
            d,
            1.0,
            &ah,
            d.k,
            &bh,
            d.k,
            0.0,
            &mut c,
            d.n,
        )
        .unwrap();
        c
    };
    let alone: Vec<Vec<f32>> = cases.iter().map(run).collect();
    let nested: Vec<Vec<f32>> = cases.par_iter().map(run).collect();
    assert_eq!(alone, nested);
}

/// The portable bf16 path holds at most `cap` widened values: a larger product runs in blocks
/// of C's rows (small `op(B)`), of C's columns (small `op(A)`) or of the depth (neither),
/// each with every transpose, strided operands, and beta 0 over a C of NaNs (which must not
/// leak in) or beta != 0. Blocks of rows or columns compute each output as the whole product
/// does; depth blocks add partial sums in f32, so against the unblocked product the bar is
/// f32 summation order (1e-6 relative), and against float64 of the rounded inputs the f32
/// bar (1e-5). Real caps: the bench config's lm_head products exceed `WIDEN_CAP` in all
/// three ways (`cpu.rs`).
#[test]
fn portable_bf16_in_blocks_matches_the_whole_product() {
    let mut rng = Rng::new(17);
    let cap = 300;
    let shapes = [
        ("rows", Dims { m: 50, n: 7, k: 13 }),
        ("columns", Dims { m: 7, n: 50, k: 13 }),
        (
            "depth",
            Dims {
                m: 20,
                n: 30,
                k: 101,
            },
        ),
    ];
    for (what, d) in shapes {
        assert!(d.m * d.k + d.k * d.n > cap, "{what}: the cap must split");
        for (ta, tb) in TRANS {
            for (alpha, beta) in [(1.0f32, 0.0f32), (-0.5, 0.75)] {
                let mut cs = case(&mut rng, ta, tb, d, 3);
                if beta == 0.0 {
                    // NaN inside the matrix, 0 in the row padding (which no path touches).
                    for (i, x) in cs.c.iter_mut().enumerate() {
                        *x = if i % cs.ldc < d.n { f32::NAN } else { 0.0 };
                    }
                }
                let (ah, bh) = (bf16s(&cs.a), bf16s(&cs.b));
                let run = |cap: usize| {
                    let mut c = cs.c.clone();
                    let ops = (&ah[..], cs.lda, &bh[..], cs.ldb, &mut c[..], cs.ldc);
                    cpu::portable(ta, tb, d, alpha, beta, ops, cap);
                    c
                };
                let (blocked, whole) = (run(cap), run(usize::MAX));
                let e = rel_l2(&blocked, &whole);
                let tag = format!("{what} {ta:?}{tb:?} alpha {alpha} beta {beta}");
                assert!(e <= 1e-6, "{tag}: blocked vs whole rel_l2 {e:e}");
                let c64 = f64s(&cs.c);
                let (ra, rb) = (rounded_f64s(&cs.a), rounded_f64s(&cs.b));
                let (al, be) = (alpha as f64, beta as f64);
                let r = reference(ta, tb, d, al, &ra, cs.lda, &rb, cs.ldb, be, &c64, cs.ldc);
                let e = rel_l2(&blocked, &r);
                assert!(e <= 1e-5, "{tag}: vs float64 rel_l2 {e:e}");
            }
        }
    }
}

#[test]
fn precision_names_parse_back() {
    for name in Precision::NAMES {
        let p: Precision = name.parse().unwrap();
        assert_eq!(p.name(), name);
    }
    assert_eq!(
        "f16".parse::<Precision>(),
        Err(UnknownPrecision("f16".into()))
    );
}
