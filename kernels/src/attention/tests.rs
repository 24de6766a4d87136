//! Checks of the fused attention against a naive float64 implementation (explicit S x S softmax
//! per sequence and head), whose backward is itself checked by central finite differences.
//!
//! Tolerances (relative L2 per tensor, DESIGN.md): f32 forward <= 1e-5, backward <= 1e-4 (f32
//! accumulation over <= 256 dims and <= 200 keys gives ~1e-6; the bar leaves headroom, not
//! slack for a wrong formula, which shows up as O(1)); bf16 forward <= 0.015, backward <= 0.04
//! (bf16 storage alone rounds at 2^-9 ~ 0.002 per element; the reference sees the same
//! bf16-rounded inputs in f64).

use half::bf16;

use super::cpu::{BwdSchedule, Isa};
use super::host::{backward, forward};
use super::reference::*;
use super::{Qkv, QkvGrad, VarlenAttention};
use crate::error::KernelError;
use crate::testutil::rel_l2;
use cannon_runtime::Float;

#[test]
fn forward_and_backward_f32_match_naive_f64() {
    for (n, c) in cases().iter().enumerate() {
        let (fwd, lse, bwd) = check_case::<f32>(Isa::detect(), c, 100 + n as u64, false);
        assert!(fwd <= 1e-5, "{c:?}: forward rel L2 {fwd:e}");
        assert!(lse <= 1e-5, "{c:?}: lse rel L2 {lse:e}");
        assert!(bwd <= 1e-4, "{c:?}: backward rel L2 {bwd:e}");
    }
}

#[test]
fn forward_and_backward_bf16_match_naive_f64() {
    for (n, c) in cases().iter().enumerate() {
        let (fwd, lse, bwd) = check_case::<bf16>(Isa::detect(), c, 200 + n as u64, true);
        assert!(fwd <= 0.015, "{c:?}: forward rel L2 {fwd:e}");
        // The LSE is f32 from f32 arithmetic on the same (bf16-valued) inputs.
        assert!(lse <= 1e-5, "{c:?}: lse rel L2 {lse:e}");
        assert!(bwd <= 0.04, "{c:?}: backward rel L2 {bwd:e}");
    }
}

/// The AVX-512, AVX2+FMA and portable instantiations each meet the f32 bars.
#[test]
fn every_isa_level_matches_naive_f64() {
    for isa in Isa::available() {
        for (n, c) in cases().iter().enumerate().step_by(2) {
            let (fwd, lse, bwd) = check_case::<f32>(isa, c, 300 + n as u64, false);
            assert!(
                fwd <= 1e-5 && lse <= 1e-5 && bwd <= 1e-4,
                "{isa:?} {c:?}: {fwd:e} {lse:e} {bwd:e}"
            );
        }
    }
}

/// The LSE saved for backward is the natural-log log-sum-exp of the scaled visible scores.
#[test]
fn lse_matches_naive_logsumexp() {
    let c = Case::new(&[3, 70, 1], 4, 2, 20, true);
    let x = data(&c, 7);
    let f = run_fwd::<f32>(Isa::detect(), &c, &c.cu(), &x);
    let (_, lse_r) = naive_forward(&c, &to_f64(&x.q), &to_f64(&x.k), &to_f64(&x.v));
    let worst = f
        .lse
        .iter()
        .zip(&lse_r)
        .map(|(&a, &r)| (a as f64 - r).abs())
        .fold(0.0, f64::max);
    // |lse| is O(10) here; f32 carries ~7 digits.
    assert!(worst <= 1e-4, "max |lse - naive| = {worst:e}");
    // Row 0 of a causal sequence sees only itself: lse = scale * q0 . k0 exactly.
    let (d, s) = (c.d, c.scale());
    let want: f64 = (0..d).map(|i| x.q[i] as f64 * x.k[i] as f64).sum::<f64>() * s;
    assert!((f.lse[0] as f64 - want).abs() <= 1e-5 * want.abs().max(1.0));
}

#[test]
fn causal_gqa_matches_eager_reference() {
    for &(hq, hkv) in &[(8, 2), (8, 4), (8, 1), (4, 4)] {
        let c = Case::new(&[50, 77], hq, hkv, 64, true);
        let (fwd, lse, bwd) = check_case::<f32>(Isa::detect(), &c, 11, false);
        assert!(
            fwd <= 1e-5 && lse <= 1e-5 && bwd <= 1e-4,
            "{c:?}: {fwd:e} {lse:e} {bwd:e}"
        );
    }
}

/// Validates the reference itself: its backward against central differences of its forward
/// for `L = sum(out * dout)`, on tiny shapes (every element of q, k, v perturbed).
#[test]
fn naive_backward_matches_finite_differences() {
    for causal in [true, false] {
        let c = Case::new(&[3, 2], 4, 2, 3, causal);
        let x = data(&c, 5);
        let (q, k, v, dout) = (to_f64(&x.q), to_f64(&x.k), to_f64(&x.v), to_f64(&x.dout));
        let loss = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
            naive_forward(&c, q, k, v)
                .0
                .iter()
                .zip(&dout)
                .map(|(o, g)| o * g)
                .sum()
        };
        let (dq, dk, dv) = naive_backward(&c, &q, &k, &v, &dout);
        let eps = 1e-5;
        let fd = |which: usize| -> Vec<f64> {
            let base = [&q, &k, &v][which];
            (0..base.len())
                .map(|i| {
                    let mut args = [q.clone(), k.clone(), v.clone()];
                    args[which][i] += eps;
                    let up = loss(&args[0], &args[1], &args[2]);
                    args[which][i] -= 2.0 * eps;
                    let down = loss(&args[0], &args[1], &args[2]);
                    (up - down) / (2.0 * eps)
                })
                .collect()
        };
        // Central differences: truncation ~eps^2 = 1e-10, rounding ~1e-16 / eps = 1e-11.
        for (name, g, which) in [("dq", &dq, 0), ("dk", &dk, 1), ("dv", &dv, 2)] {
            let e = rel_l2(g, &fd(which));
            assert!(
                e <= 1e-7,
                "causal={causal} {name}: rel L2 vs finite differences {e:e}"
            );
        }
    }
}

/// Fused and split backward schedules give the same bits, and so do 1 and 2 threads.
#[test]
fn backward_schedules_and_thread_counts_agree_bitwise() {
    let bits = |b: &Bwd<f32>| -> Vec<u32> {
        b.dq.iter()
            .chain(&b.dk)
            .chain(&b.dv)
            .map(|x| x.to_bits())
            .collect()
    };
    for (n, c) in cases().iter().enumerate() {
        let (x, cu) = (data(c, 400 + n as u64), c.cu());
        let isa = Isa::detect();
        let f = run_fwd::<f32>(isa, c, &cu, &x);
        let fused = bits(&run_bwd(isa, BwdSchedule::Fused, c, &cu, &x, &f));
        let split = bits(&run_bwd(isa, BwdSchedule::Split, c, &cu, &x, &f));
        assert!(fused == split, "{c:?}: fused and split schedules differ");
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let (f1, b1) = one.install(|| {
            let f1 = run_fwd::<f32>(isa, c, &cu, &x);
            let b1 = run_bwd(isa, BwdSchedule::Auto, c, &cu, &x, &f1);
            (f1, b1)
        });
        let same_fwd = f1
            .out
            .iter()
            .zip(&f.out)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same_fwd,
            "{c:?}: forward differs between 1 thread and the default pool"
        );
        assert!(
            bits(&b1) == fused,
            "{c:?}: backward differs between 1 thread and the default pool"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Multi-image independence (DESIGN.md): block-diagonal attention per image.

/// Rows `[start, end)` of each sequence, in tokens.
fn ranges(c: &Case) -> Vec<(usize, usize)> {
    let cu = c.cu();
    cu.iter()
        .enumerate()
        .map(|(i, &e)| (if i == 0 { 0 } else { cu[i - 1] }, e))
        .collect()
}

/// For every image A of `c`: (1) A's out and lse are bit-identical when every other image's
/// q/k/v change; (2) with dout nonzero only on A's rows, dq/dk/dv on the other rows are exactly
/// 0, and A's own gradients do not change when the other images change.
fn check_independence<E: Float>(c: &Case) {
    let cu = c.cu();
    let isa = Isa::detect();
    let (hq, hkv, d) = (c.hq, c.hkv, c.d);
    for (ai, &(a0, a1)) in ranges(c).iter().enumerate() {
        let base = data(c, 500 + ai as u64);
        let mut other = data(c, 600 + ai as u64);
        // Same A rows, different everything else.
        other.q[a0 * hq * d..a1 * hq * d].copy_from_slice(&base.q[a0 * hq * d..a1 * hq * d]);
        other.k[a0 * hkv * d..a1 * hkv * d].copy_from_slice(&base.k[a0 * hkv * d..a1 * hkv * d]);
        other.v[a0 * hkv * d..a1 * hkv * d].copy_from_slice(&base.v[a0 * hkv * d..a1 * hkv * d]);
        let mut grads = Vec::new();
        for x in [&base, &other] {
            let f = run_fwd::<E>(isa, c, &cu, x);
            let mut dout = x.dout.clone();
            for (t, row) in dout.chunks_mut(hq * d).enumerate() {
                if t < a0 || t >= a1 {
                    row.fill(0.0);
                } else {
                    row.copy_from_slice(&base.dout[t * hq * d..(t + 1) * hq * d]);
                }
            }
            let xd = Data {
                dout,
                q: x.q.clone(),
                k: x.k.clone(),
                v: x.v.clone(),
            };
            let b = run_bwd::<E>(isa, BwdSchedule::Auto, c, &cu, &xd, &f);
            for (name, g, w) in [
                ("dq", &b.dq, hq * d),
                ("dk", &b.dk, hkv * d),
                ("dv", &b.dv, hkv * d),
            ] {
                let outside = g
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| i / w < a0 || i / w >= a1);
                for (i, v) in outside {
                    assert!(
                        v.to_f32() == 0.0,
                        "{c:?} image {ai}: {name}[{i}] = {} != 0",
                        v.to_f32()
                    );
                }
            }
            let a_bits = |v: &[E], w: usize| -> Vec<u32> {
                widen(&v[a0 * w..a1 * w])
                    .iter()
                    .map(|x| x.to_bits())
                    .collect()
            };
            grads.push((
                a_bits(&f.out, hq * d),
                f.lse[a0 * hq..a1 * hq]
                    .iter()
                    .map(|x| x.to_bits())
                    .collect::<Vec<_>>(),
                [
                    a_bits(&b.dq, hq * d),
                    a_bits(&b.dk, hkv * d),
                    a_bits(&b.dv, hkv * d),
                ],
            ));
        }
        assert!(
            grads[0].0 == grads[1].0,
            "{c:?}: image {ai}'s output changed with the others"
        );
        assert!(
            grads[0].1 == grads[1].1,
            "{c:?}: image {ai}'s lse changed with the others"
        );
        assert!(
            grads[0].2 == grads[1].2,
            "{c:?}: image {ai}'s gradients changed with the others"
        );
    }
}

#[test]
fn images_64_and_96_patches_are_independent() {
    let c = Case::new(&[64, 96], 4, 4, 64, false);
    assert_eq!(c.cu(), vec![64, 160]);
    check_independence::<f32>(&c);
    check_independence::<bf16>(&c);
}

#[test]
fn three_images_of_different_sizes_are_independent() {
    check_independence::<f32>(&Case::new(&[30, 81, 7], 4, 4, 24, false));
    check_independence::<bf16>(&Case::new(&[30, 81, 7], 2, 1, 24, true));
}

#[test]
fn two_images_of_the_same_size_are_independent() {
    // Equal lengths would make a batch-of-two-without-cu_seqlens bug invisible elsewhere.
    check_independence::<f32>(&Case::new(&[64, 64], 4, 4, 64, false));
    check_independence::<f32>(&Case::new(&[20, 20], 4, 2, 16, true));
}

// ---------------------------------------------------------------------------------------------
// Edge cases and argument checking, through the public API.

#[test]
fn zero_tokens_and_empty_sequences() {
    for cu in [&[][..], &[0][..], &[0, 0][..]] {
        let a = VarlenAttention::new(cu, 0, 4, 2, 8, true);
        let (mut out, mut lse) = (Vec::<f32>::new(), Vec::new());
        forward(
            &a,
            Qkv {
                q: &[],
                k: &[],
                v: &[],
            },
            &mut out,
            &mut lse,
        )
        .unwrap();
        let (mut dq, mut dk, mut dv) = (Vec::<f32>::new(), Vec::new(), Vec::new());
        let g = QkvGrad {
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
        };
        backward(
            &a,
            Qkv {
                q: &[],
                k: &[],
                v: &[],
            },
            &[],
            &[],
            &[],
            g,
        )
        .unwrap();
    }
    // Repeated ends (empty sequences) between real ones, and the leading-0 form: same result
    // as the plain form.
    let c = Case::new(&[4, 0, 0, 9, 0], 2, 1, 6, true);
    let x = data(&c, 9);
    let plain = run_fwd::<f32>(Isa::detect(), &c, &[4, 13], &x);
    let (t, hq, hkv, d) = (c.t(), c.hq, c.hkv, c.d);
    for cu in [&[4, 4, 4, 13, 13][..], &[0, 4, 13][..]] {
        let a = VarlenAttention::new(cu, t, hq, hkv, d, true);
        let (mut out, mut lse) = (vec![0.0f32; t * hq * d], vec![0.0f32; t * hq]);
        forward(
            &a,
            Qkv {
                q: &x.q,
                k: &x.k,
                v: &x.v,
            },
            &mut out,
            &mut lse,
        )
        .unwrap();
        assert!(out == plain.out && lse == plain.lse, "cu_seqlens {cu:?}");
    }
}

#[test]
fn bad_arguments_are_errors_naming_the_op() {
    let (t, hq, hkv, d) = (10, 4, 2, 8);
    let q = vec![0.0f32; t * hq * d];
    let kv = vec![0.0f32; t * hkv * d];
    let x = Qkv {
        q: &q,
        k: &kv,
        v: &kv,
    };
    let fwd = |a: &VarlenAttention, x: Qkv<f32>| {
        let (mut out, mut lse) = (vec![0.0f32; t * hq * d], vec![0.0f32; t * hq]);
        forward(a, x, &mut out, &mut lse)
    };
    let bad = [
        (
            VarlenAttention::new(&[6, 4, 10], t, hq, hkv, d, true),
            "non-decreasing",
        ),
        (
            VarlenAttention::new(&[4, 9], t, hq, hkv, d, true),
            "must end at the token count",
        ),
        (
            VarlenAttention::new(&[4, 11], t, hq, hkv, d, true),
            "must end at the token count",
        ),
        (
            VarlenAttention::new(&[], t, hq, hkv, d, true),
            "must end at the token count",
        ),
        (
            VarlenAttention::new(&[2, 5, 10, 0], t, hq, hkv, d, true),
            "non-decreasing",
        ),
        (
            VarlenAttention::new(&[10], t, 4, 3, d, true),
            "multiple of kv_heads",
        ),
        (
            VarlenAttention::new(&[10], t, 0, 0, d, true),
            "multiple of kv_heads",
        ),
        (
            VarlenAttention::new(&[10], t, hq, hkv, d, true).with_scale(f32::NAN),
            "scale",
        ),
        (
            VarlenAttention::new(&[usize::MAX], usize::MAX, hq, hkv, d, true),
            "overflows",
        ),
    ];
    for (a, want) in bad {
        let e = fwd(&a, x).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, KernelError::InvalidArgument { .. }), "{msg}");
        assert!(
            msg.starts_with("attention_forward") && msg.contains(want),
            "{msg}"
        );
    }
    // Length mismatches are shape errors.
    let a = VarlenAttention::new(&[10], t, hq, hkv, d, true);
    let e = fwd(
        &a,
        Qkv {
            q: &q[1..],
            k: &kv,
            v: &kv,
        },
    )
    .unwrap_err();
    assert!(
        matches!(e, KernelError::Shape { .. }) && e.to_string().contains("q has"),
        "{e}"
    );
    let (mut dq, mut dk, mut dv) = (
        vec![0.0f32; q.len()],
        vec![0.0f32; kv.len()],
        vec![0.0f32; 1],
    );
    let g = QkvGrad {
        dq: &mut dq,
        dk: &mut dk,
        dv: &mut dv,
    };
    let lse = vec![0.0f32; t * hq];
    let e = backward(&a, x, &q, &lse, &q, g).unwrap_err();
    assert!(
        e.to_string().starts_with("attention_backward") && e.to_string().contains("dv has"),
        "{e}"
    );
    let bad_cu = VarlenAttention::new(&[5, 3], t, hq, hkv, d, true);
    let (mut dq, mut dk, mut dv) = (
        vec![0.0f32; q.len()],
        vec![0.0f32; kv.len()],
        vec![0.0f32; kv.len()],
    );
    let g = QkvGrad {
        dq: &mut dq,
        dk: &mut dk,
        dv: &mut dv,
    };
    let e = backward(&bad_cu, x, &q, &lse, &q, g).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("attention_backward: invalid argument"),
        "{e}"
    );
}

/// The public entry points use the same kernel as the ISA-level tests (a smoke check that the
/// wiring passes the right buffers): public forward + backward vs naive on one GQA case.
#[test]
fn public_api_matches_naive_f64() {
    let c = Case::new(&[40, 25], 6, 3, 12, true);
    let x = data(&c, 21);
    let cu = c.cu();
    let a = VarlenAttention::new(&cu, c.t(), c.hq, c.hkv, c.d, c.causal);
    let qkv = Qkv {
        q: &x.q[..],
        k: &x.k[..],
        v: &x.v[..],
    };
    let (mut out, mut lse) = (vec![0.0f32; x.q.len()], vec![0.0f32; c.t() * c.hq]);
    forward(&a, qkv, &mut out, &mut lse).unwrap();
    let (mut dq, mut dk, mut dv) = (
        vec![0.0f32; x.q.len()],
        vec![0.0f32; x.k.len()],
        vec![0.0f32; x.v.len()],
    );
    let g = QkvGrad {
        dq: &mut dq,
        dk: &mut dk,
        dv: &mut dv,
    };
    backward(&a, qkv, &out, &lse, &x.dout, g).unwrap();
    let (q, k, v, dout) = (to_f64(&x.q), to_f64(&x.k), to_f64(&x.v), to_f64(&x.dout));
    let (out_r, _) = naive_forward(&c, &q, &k, &v);
    let (dq_r, dk_r, dv_r) = naive_backward(&c, &q, &k, &v, &dout);
    assert!(rel_l2(&out, &out_r) <= 1e-5);
    for (g, r) in [(&dq, &dq_r), (&dk, &dk_r), (&dv, &dv_r)] {
        assert!(rel_l2(g, r) <= 1e-4, "{:e}", rel_l2(g, r));
    }
}

/// The vectorisable `exp2` against f64 over its whole range, both FMA variants: relative error
/// <= 4e-7 (the polynomial's ~1e-7 plus rounding in the reduction and the f32 evaluation), exactly 0 below -126 and
/// for -inf (masked scores must contribute nothing), NaN kept (a diverged run must show it).
#[test]
fn exp2_is_accurate_and_handles_the_edges() {
    use super::simd::exp2;
    let mut worst = 0.0f64;
    let mut x = -126.0f32;
    while x <= 127.0 {
        for (fma, y) in [(true, exp2::<true>(x)), (false, exp2::<false>(x))] {
            let want = (x as f64).exp2();
            let e = (y as f64 / want - 1.0).abs();
            assert!(e <= 4e-7, "exp2({x}) fma={fma}: {y} vs {want}");
            worst = worst.max(e);
        }
        x += 0.001_9;
    }
    assert!(
        worst > 0.0,
        "the polynomial is not exact: the loop must have compared something"
    );
    for x in [-126.01f32, -127.0, -150.0, -1e30, f32::NEG_INFINITY] {
        assert_eq!(exp2::<true>(x), 0.0, "exp2({x})");
        assert_eq!(exp2::<false>(x), 0.0, "exp2({x})");
    }
    assert!(exp2::<true>(f32::NAN).is_nan() && exp2::<false>(f32::NAN).is_nan());
}

/// The column chunking every ISA's micro-kernels follow: contiguous chunks covering `n`,
/// widths the micro-kernels exist for, and a chunk handed back to `panel` is one call of the
/// same width (what lets backward put its column loop outside its key loop without changing
/// a bit).
#[test]
fn column_chunks_cover_and_reproduce_themselves() {
    use super::simd::{col_chunks, NR};
    fn check<const W: usize>() {
        for n in (0..=256).step_by(NR) {
            let chunks: Vec<_> = col_chunks::<W>(n).collect();
            let mut next = 0;
            for &(j, w) in &chunks {
                assert_eq!(j, next, "W {W} n {n}: {chunks:?}");
                assert!(
                    w == W || w == NR || (w == 2 * NR && W > 2 * NR),
                    "{chunks:?}"
                );
                assert_eq!(
                    col_chunks::<W>(w).collect::<Vec<_>>(),
                    [(0, w)],
                    "W {W} w {w}"
                );
                next = j + w;
            }
            assert_eq!(next, n, "W {W} n {n}: {chunks:?}");
        }
    }
    // The widths `isa_dispatch!` instantiates: portable and AVX2 (16), AVX-512 (64).
    check::<16>();
    check::<64>();
}
