//! Casts, elementwise ops, GEMM and linear, and a misaligned view.

use crate::{bf, down, emu, f64s, streams, up};
use cannon_kernels::gemm::{Dims, Trans};
use cannon_kernels::linear::{LinearDims, LinearGradBufs};
use cannon_kernels::ops;
use cannon_kernels::testutil::{rel_l2, Rng};
use cannon_kernels::{KernelError, Precision};
use cannon_runtime::{DeviceBuffer, Float, Stream};
use half::bf16;

#[test]
fn cast_matches_the_cpu_bit_for_bit() {
    let (_g, c, n) = streams();
    // Ties, values past bf16's range, denormals and signed zeros.
    let mut src: Vec<f32> = Rng::new(1).normal_vec(1000, 3.0);
    src.extend([
        1.0 + f32::EPSILON * 64.0,
        3.4e38,
        -3.4e38,
        1e-40,
        -0.0,
        0.0,
        65504.0,
    ]);
    let run = |s: &Stream| {
        let a = up(s, &src);
        let mut b = DeviceBuffer::<bf16>::alloc(s, src.len()).unwrap();
        ops::cast(s, &a.view(), &mut b.view_mut()).unwrap();
        let mut back = DeviceBuffer::<f32>::alloc(s, src.len()).unwrap();
        ops::cast(s, &b.view(), &mut back.view_mut()).unwrap();
        (down(s, &b), down(s, &back))
    };
    let (cb, cf) = run(&c);
    let (nb, nf) = run(&n);
    assert_eq!(
        cb.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        nb.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    assert_eq!(
        cf.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        nf.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
}

fn elementwise<E: Float>(conv: impl Fn(&[f32]) -> Vec<E>) {
    let (_g, c, n) = streams();
    let mut rng = Rng::new(2);
    let a = conv(&rng.normal_vec(777, 1.0));
    let b = conv(&rng.normal_vec(777, 1.0));
    let run = |s: &Stream| {
        let (x, y) = (up(s, &a), up(s, &b));
        let mut out = DeviceBuffer::<E>::alloc(s, a.len()).unwrap();
        ops::mul(s, &mut out.view_mut(), &x.view(), &y.view()).unwrap();
        let mut acc = up(s, &a);
        ops::add_into(s, &mut acc.view_mut(), &y.view()).unwrap();
        ops::mul_into(s, &mut acc.view_mut(), &x.view()).unwrap();
        (down(s, &out), down(s, &acc))
    };
    let (co, ca) = run(&c);
    let (no, na) = run(&n);
    // One f32 operation and one rounding per element on both sides: identical.
    assert_eq!(f64s(&co), f64s(&no));
    assert_eq!(f64s(&ca), f64s(&na));
}

#[test]
fn elementwise_ops_match_the_cpu_exactly() {
    elementwise::<f32>(|v| v.to_vec());
    elementwise::<bf16>(bf);
}

/// C = alpha op(A) op(B) + beta C with every transpose, a row stride past the row, and both
/// precisions, against the CPU's gemm.
#[test]
fn gemm_matches_the_cpu() {
    let (_g, c, n) = streams();
    let mut rng = Rng::new(3);
    let d = Dims {
        m: 37,
        n: 29,
        k: 53,
    };
    for (p, tol) in [(Precision::F32, 1e-6), (Precision::Bf16, 1e-6)] {
        for ta in [Trans::N, Trans::T] {
            for tb in [Trans::N, Trans::T] {
                for (alpha, beta, ldc) in
                    [(1.0f32, 0.0f32, d.n), (0.5, 1.0, d.n + 3), (2.0, -0.5, d.n)]
                {
                    let (ar, ac) = if ta == Trans::N {
                        (d.m, d.k)
                    } else {
                        (d.k, d.m)
                    };
                    let (br, bc) = if tb == Trans::N {
                        (d.k, d.n)
                    } else {
                        (d.n, d.k)
                    };
                    let (lda, ldb) = (ac + 1, bc);
                    let a = rng.normal_vec((ar - 1) * lda + ac, 1.0);
                    let b = rng.normal_vec(br * ldb, 1.0);
                    let c0 = rng.normal_vec((d.m - 1) * ldc + d.n, 1.0);
                    let run = |s: &Stream| {
                        let (x, y) = (up(s, &a), up(s, &b));
                        let mut z = up(s, &c0);
                        ops::gemm(
                            s,
                            p,
                            ta,
                            tb,
                            d,
                            alpha,
                            &x.view(),
                            lda,
                            &y.view(),
                            ldb,
                            beta,
                            &mut z.view_mut(),
                            ldc,
                        )
                        .unwrap();
                        down(s, &z)
                    };
                    let (cc, nc) = (run(&c), run(&n));
                    let e = rel_l2(&nc, &cc);
                    assert!(
                        e <= crate::bar(tol, p == Precision::Bf16),
                        "{p} {ta:?}{tb:?} alpha {alpha} beta {beta}: rel L2 {e:e}"
                    );
                }
            }
        }
    }
}

fn linear<X: Float>(p: Precision, conv: impl Fn(&[f32]) -> Vec<X>, tol: f64) {
    let (_g, c, n) = streams();
    let mut rng = Rng::new(4);
    let d = LinearDims {
        t: 19,
        d_in: 24,
        d_out: 40,
    };
    let x = conv(&rng.normal_vec(d.t * d.d_in, 1.0));
    let w = conv(&rng.normal_vec(d.d_out * d.d_in, 0.2));
    let b = conv(&rng.normal_vec(d.d_out, 0.2));
    let dy = conv(&rng.normal_vec(d.t * d.d_out, 1.0));
    let g0 = rng.normal_vec(d.t * d.d_in + d.d_out * d.d_in + d.d_out, 1.0);
    let run = |s: &Stream| {
        let (xb, wb, bb, dyb) = (up(s, &x), up(s, &w), up(s, &b), up(s, &dy));
        let mut y = DeviceBuffer::<X>::alloc(s, d.t * d.d_out).unwrap();
        ops::linear_forward(
            s,
            p,
            &mut y.view_mut(),
            &xb.view(),
            &wb.view(),
            Some(&bb.view()),
            d,
        )
        .unwrap();
        let mut gdx = up(s, &g0[..d.t * d.d_in]);
        let mut gdw = up(s, &g0[d.t * d.d_in..d.t * d.d_in + d.d_out * d.d_in]);
        let mut gdb = up(s, &g0[d.t * d.d_in + d.d_out * d.d_in..]);
        let grads = LinearGradBufs {
            dx: Some(gdx.view_mut()),
            dw: Some(gdw.view_mut()),
            db: Some(gdb.view_mut()),
        };
        ops::linear_backward(s, p, grads, &dyb.view(), &xb.view(), &wb.view(), d).unwrap();
        (down(s, &y), down(s, &gdx), down(s, &gdw), down(s, &gdb))
    };
    let cr = run(&c);
    let nr = run(&n);
    for (what, e) in [
        ("y", rel_l2(&f64s(&nr.0), &f64s(&cr.0))),
        ("dx", rel_l2(&nr.1, &cr.1)),
        ("dw", rel_l2(&nr.2, &cr.2)),
        ("db", rel_l2(&nr.3, &cr.3)),
    ] {
        assert!(
            e <= crate::bar(tol, p == Precision::Bf16),
            "{p} {what}: rel L2 {e:e}"
        );
    }
}

#[test]
fn linear_matches_the_cpu() {
    linear::<f32>(Precision::F32, |v| v.to_vec(), 1e-6);
    linear::<f32>(Precision::Bf16, |v| v.to_vec(), 1e-6);
    // bf16 y: one rounding of an f32 sum whose order differs from the CPU's.
    linear::<bf16>(Precision::Bf16, bf, 4e-3);
}

#[test]
fn a_bf16_operand_under_f32_precision_is_a_typed_error() {
    let (_g, _, n) = streams();
    let a = up(&n, &bf(&[1.0; 4]));
    let b = up(&n, &[1.0f32; 4]);
    let mut z = up(&n, &[0.0f32; 4]);
    let d = Dims { m: 2, n: 2, k: 2 };
    let e = ops::gemm(
        &n,
        Precision::F32,
        Trans::N,
        Trans::N,
        d,
        1.0,
        &a.view(),
        2,
        &b.view(),
        2,
        0.0,
        &mut z.view_mut(),
        2,
    )
    .unwrap_err();
    assert!(
        matches!(e, KernelError::InvalidArgument { op: "gemm", .. }),
        "{e}"
    );
}

/// The aclnn error of a failed call: its C function and the emulator's message.
fn aclnn_err(e: KernelError) -> (&'static str, String) {
    match e {
        KernelError::Aclnn { call, message, .. } => (call, message),
        other => panic!("expected an aclnn error, got {other}"),
    }
}

#[test]
fn a_view_at_an_odd_offset_is_a_misaligned_address() {
    let (_g, _, n) = streams();
    let mut y = up(&n, &[1.0f32; 64]);
    let x = up(&n, &[1.0f32; 63]);
    let mut yv = y.slice_mut(1..64).unwrap();
    let (call, m) = aclnn_err(ops::add_into(&n, &mut yv, &x.view()).unwrap_err());
    assert_eq!(call, "aclnnInplaceAddGetWorkspaceSize");
    if emu() {
        assert!(m.contains("not 32-byte aligned"), "{m}");
    }
    // Nothing ran: y is unchanged.
    assert_eq!(down(&n, &y), vec![1.0f32; 64]);
}
