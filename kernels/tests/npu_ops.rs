//! Every op's NPU body run for real against the host emulation of CANN (`cannon-cann-emu`),
//! through the public device-level API (`cannon_kernels::ops::*`) on `Device::Npu(0)`, and
//! compared with the same call on the CPU backend (whose kernels the unit tests check against
//! float64 references).
//!
//! Tolerances: the emulator runs the same CPU kernels or f32 arithmetic with one rounding, so
//! f32 results agree with the CPU path to f32 rounding of a different summation order (rel L2
//! <= 1e-6 unless stated) and bf16 results to within one bf16 rounding of a few elements
//! (rel L2 <= 4e-3, well inside the project's bf16 bars of 0.015 forward / 0.04 gradients).
//!
//! Every test calls `emu()` first so the CANN is chosen before the first CANN call: the
//! emulator here, an installed CANN on an Ascend host (the same comparisons then check the
//! hardware; only the emulator's own message texts are not checked there).

#![cfg(feature = "npu")]

use cannon_kernels::gemm::{Dims, Trans};
use cannon_kernels::linear::{LinearDims, LinearGradBufs};
use cannon_kernels::ops;
use cannon_kernels::testutil::{rel_l2, Rng};
use cannon_kernels::{KernelError, Precision};
use cannon_runtime::{Device, DeviceBuffer, Element, Float, Stream};
use half::bf16;

/// Picks the CANN to test against (the emulator, or an installed CANN on an Ascend host);
/// true when it is the emulator.
fn emu() -> bool {
    match cannon_sys::emulator::select_for_tests() {
        Ok(c) => c.is_emulator(),
        Err(e) => panic!("{e}"),
    }
}

/// One test at a time on the NPU. Scratch and workspace blocks go back to the device's
/// caching allocator as soon as the op using them is queued, which is safe for reuse by later
/// work on the same stream only (torch's rule without record_stream); two tests on two
/// streams of one device at once would break it, as two streams would in a training step.
static NPU: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A CPU stream and an NPU stream, and the NPU for this test alone.
fn streams() -> (std::sync::MutexGuard<'static, ()>, Stream, Stream) {
    emu();
    let g = NPU.lock().unwrap_or_else(|p| p.into_inner());
    (
        g,
        Stream::new(Device::Cpu).unwrap(),
        Stream::new(Device::Npu(0)).unwrap(),
    )
}

fn up<T: Element>(s: &Stream, v: &[T]) -> DeviceBuffer<T> {
    DeviceBuffer::clone_htod(s, v).unwrap()
}

fn down<T: Element>(s: &Stream, b: &DeviceBuffer<T>) -> Vec<T> {
    s.synchronize().unwrap();
    b.clone_dtoh(s).unwrap()
}

fn f64s<T: Float>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f32() as f64).collect()
}

fn bf(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

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
                        e <= tol,
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
        assert!(e <= tol, "{p} {what}: rel L2 {e:e}");
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

fn rmsnorm<E: Float>(conv: impl Fn(&[f32]) -> Vec<E>, tol: f64) {
    let (_g, c, n) = streams();
    let mut rng = Rng::new(5);
    let (t, d) = (13, 48);
    let x = conv(&rng.normal_vec(t * d, 1.0));
    let w = conv(
        &rng.normal_vec(d, 0.5)
            .iter()
            .map(|v| v + 1.0)
            .collect::<Vec<_>>(),
    );
    let dout = conv(&rng.normal_vec(t * d, 1.0));
    let dx0 = conv(&rng.normal_vec(t * d, 1.0));
    let dw0 = rng.normal_vec(d, 1.0);
    let run = |s: &Stream| {
        let (xb, wb, db) = (up(s, &x), up(s, &w), up(s, &dout));
        let mut y = DeviceBuffer::<E>::alloc(s, t * d).unwrap();
        let mut r = DeviceBuffer::<f32>::alloc(s, t).unwrap();
        ops::rmsnorm_forward(
            s,
            &mut y.view_mut(),
            &mut r.view_mut(),
            &xb.view(),
            &wb.view(),
            d,
            1e-5,
        )
        .unwrap();
        let (mut dx, mut dw) = (up(s, &dx0), up(s, &dw0));
        ops::rmsnorm_backward(
            s,
            &mut dx.view_mut(),
            &mut dw.view_mut(),
            &db.view(),
            &xb.view(),
            &wb.view(),
            &r.view(),
            d,
        )
        .unwrap();
        (down(s, &y), down(s, &r), down(s, &dx), down(s, &dw))
    };
    let (cr, nr) = (run(&c), run(&n));
    for (what, e) in [
        ("y", rel_l2(&f64s(&nr.0), &f64s(&cr.0))),
        ("rstd", rel_l2(&nr.1, &cr.1)),
        ("dx", rel_l2(&f64s(&nr.2), &f64s(&cr.2))),
        ("dw", rel_l2(&nr.3, &cr.3)),
    ] {
        assert!(e <= tol, "{}: {what}: rel L2 {e:e}", E::DTYPE);
    }
}

#[test]
fn rmsnorm_matches_the_cpu() {
    rmsnorm::<f32>(|v| v.to_vec(), 1e-6);
    // bf16 dx: the grad op's rounding and then the accumulation's (the CPU rounds once).
    rmsnorm::<bf16>(bf, 4e-3);
}

fn swiglu<E: Float>(conv: impl Fn(&[f32]) -> Vec<E>, tol: f64) {
    let (_g, c, n) = streams();
    let mut rng = Rng::new(6);
    // N not a multiple of 16, so the 32-byte padding of the stacked operand is exercised.
    let len = 1001;
    let (g, u, dh) = (
        conv(&rng.normal_vec(len, 2.0)),
        conv(&rng.normal_vec(len, 1.0)),
        conv(&rng.normal_vec(len, 1.0)),
    );
    let (dg0, du0) = (
        conv(&rng.normal_vec(len, 1.0)),
        conv(&rng.normal_vec(len, 1.0)),
    );
    let run = |s: &Stream| {
        let (gb, ub, dhb) = (up(s, &g), up(s, &u), up(s, &dh));
        let mut h = DeviceBuffer::<E>::alloc(s, len).unwrap();
        ops::swiglu_forward(s, &mut h.view_mut(), &gb.view(), &ub.view()).unwrap();
        let (mut dg, mut du) = (up(s, &dg0), up(s, &du0));
        ops::swiglu_backward(
            s,
            &mut dg.view_mut(),
            &mut du.view_mut(),
            &dhb.view(),
            &gb.view(),
            &ub.view(),
        )
        .unwrap();
        (down(s, &h), down(s, &dg), down(s, &du))
    };
    let (cr, nr) = (run(&c), run(&n));
    assert_eq!(f64s(&cr.0), f64s(&nr.0), "{}: h", E::DTYPE);
    for (what, e) in [
        ("d_gate", rel_l2(&f64s(&nr.1), &f64s(&cr.1))),
        ("d_up", rel_l2(&f64s(&nr.2), &f64s(&cr.2))),
    ] {
        assert!(e <= tol, "{}: {what}: rel L2 {e:e}", E::DTYPE);
    }
}

#[test]
fn swiglu_matches_the_cpu() {
    swiglu::<f32>(|v| v.to_vec(), 1e-6);
    swiglu::<bf16>(bf, 4e-3);
}

fn rope<E: Float>(conv: impl Fn(&[f32]) -> Vec<E>, tol: f64) {
    use cannon_kernels::rope::RopeTable;
    let (_g, c, n) = streams();
    let mut rng = Rng::new(7);
    let (t, h, d) = (11, 3, 16);
    let x = conv(&rng.normal_vec(t * h * d, 1.0));
    let pos: Vec<u32> = (0..t as u32).map(|i| (i * 7) % 40).collect();
    for table in [
        RopeTable::text(d, 10000.0, 64).unwrap(),
        RopeTable::axial(d, 10000.0, 8, 8).unwrap(),
    ] {
        let run = |s: &Stream| {
            let mut xb = up(s, &x);
            ops::rope_forward(s, &mut xb.view_mut(), h, &table, &pos).unwrap();
            let fwd = down(s, &xb);
            ops::rope_backward(s, &mut xb.view_mut(), h, &table, &pos).unwrap();
            (fwd, down(s, &xb))
        };
        let pos_ok = pos.iter().all(|&p| (p as usize) < table.slots());
        if !pos_ok {
            continue;
        }
        let (cr, nr) = (run(&c), run(&n));
        let e = rel_l2(&f64s(&nr.0), &f64s(&cr.0));
        assert!(e <= tol, "{} forward: rel L2 {e:e}", E::DTYPE);
        let e = rel_l2(&f64s(&nr.1), &f64s(&cr.1));
        assert!(e <= tol, "{} backward: rel L2 {e:e}", E::DTYPE);
        // The backward undoes the forward: x comes back (to rounding).
        let e = rel_l2(&f64s(&nr.1), &f64s(&x));
        assert!(e <= 10.0 * tol, "{} round trip: rel L2 {e:e}", E::DTYPE);
    }
}

#[test]
fn rope_matches_the_cpu() {
    rope::<f32>(|v| v.to_vec(), 1e-6);
    // bf16 cos/sin (the op's dtype rule) against the CPU's f32 table.
    rope::<bf16>(bf, 8e-3);
}

fn embedding<E: Float>(conv: impl Fn(&[f32]) -> Vec<E>) {
    let (_g, c, n) = streams();
    let mut rng = Rng::new(8);
    let (v, d) = (23, 40);
    let ids: Vec<u32> = (0..37).map(|i| (i * i % v) as u32).collect();
    let w = conv(&rng.normal_vec(v * d, 1.0));
    let dout = conv(&rng.normal_vec(ids.len() * d, 1.0));
    let dw0 = rng.normal_vec(v * d, 1.0);
    let run = |s: &Stream| {
        let wb = up(s, &w);
        let mut out = DeviceBuffer::<E>::alloc(s, ids.len() * d).unwrap();
        ops::embedding_forward(s, &mut out.view_mut(), &ids, &wb.view(), d).unwrap();
        let db = up(s, &dout);
        let mut dw = up(s, &dw0);
        ops::embedding_backward(s, &mut dw.view_mut(), &db.view(), &ids, d).unwrap();
        (down(s, &out), down(s, &dw))
    };
    let (cr, nr) = (run(&c), run(&n));
    assert_eq!(f64s(&cr.0), f64s(&nr.0), "{} forward is a gather", E::DTYPE);
    // Sums of up to 3 rows in f32, in another order than the CPU's.
    let e = rel_l2(&nr.1, &cr.1);
    assert!(e <= 1e-6, "{} backward: rel L2 {e:e}", E::DTYPE);
    // An id past the vocabulary is the host check's typed error, before any device work.
    let e = ops::embedding_forward(
        &n,
        &mut DeviceBuffer::<E>::alloc(&n, d).unwrap().view_mut(),
        &[v as u32],
        &up(&n, &w).view(),
        d,
    )
    .unwrap_err();
    assert!(matches!(e, KernelError::InvalidArgument { .. }), "{e}");
}

#[test]
fn embedding_matches_the_cpu() {
    embedding::<f32>(|v| v.to_vec());
    embedding::<bf16>(bf);
}

#[test]
fn cross_entropy_matches_the_cpu() {
    use cannon_kernels::cross_entropy::{LmHeadGrads, LossNorm, IGNORE_INDEX};
    let (_g, c, n) = streams();
    let mut rng = Rng::new(9);
    let (rows, v, dm) = (29, 50, 24);
    let mut labels: Vec<i32> = (0..rows).map(|i| ((i * 13) % v) as i32).collect();
    labels[3] = IGNORE_INDEX;
    labels[17] = IGNORE_INDEX;
    let logits = rng.normal_vec(rows * v, 2.0);
    let h = rng.normal_vec(rows * dm, 1.0);
    let w = rng.normal_vec(v * dm, 0.3);
    let (dh0, dw0) = (rng.normal_vec(rows * dm, 1.0), rng.normal_vec(v * dm, 1.0));
    for norm in [LossNorm::Mean, LossNorm::Divisor(100.0)] {
        let run = |s: &Stream| {
            let lb = up(s, &logits);
            let mut d = DeviceBuffer::<f32>::alloc(s, rows * v).unwrap();
            let st = ops::cross_entropy(s, &lb.view(), &labels, v, Some(&mut d.view_mut()), norm)
                .unwrap();
            let mut lip = up(s, &logits);
            let st2 =
                ops::cross_entropy_in_place(s, &mut lip.view_mut(), &labels, v, norm).unwrap();
            let (hb, wb) = (up(s, &h), up(s, &w));
            let (mut dh, mut dw) = (up(s, &dh0), up(s, &dw0));
            let grads = LmHeadGrads {
                dh: Some(dh.view_mut()),
                dw: Some(dw.view_mut()),
            };
            let st3 = ops::cross_entropy_lm_head(
                s,
                &hb.view(),
                &wb.view(),
                &labels,
                dm,
                v,
                8,
                norm,
                grads,
            )
            .unwrap();
            (
                st,
                down(s, &d),
                st2,
                down(s, &lip),
                st3,
                down(s, &dh),
                down(s, &dw),
            )
        };
        let (cr, nr) = (run(&c), run(&n));
        for (what, a, b) in [
            ("full", cr.0, nr.0),
            ("in place", cr.2, nr.2),
            ("lm_head", cr.4, nr.4),
        ] {
            assert_eq!(a.count, b.count, "{what}");
            let e = (a.loss - b.loss).abs() / a.loss.abs();
            assert!(e <= 1e-6, "{norm:?} {what} loss {} vs {}", b.loss, a.loss);
        }
        for (what, e) in [
            ("d_logits", rel_l2(&nr.1, &cr.1)),
            ("in place", rel_l2(&nr.3, &cr.3)),
            ("dh", rel_l2(&nr.5, &cr.5)),
            ("dw", rel_l2(&nr.6, &cr.6)),
        ] {
            assert!(e <= 1e-5, "{norm:?} {what}: rel L2 {e:e}");
        }
    }
}

#[test]
fn adamw_matches_the_cpu() {
    use cannon_kernels::adamw::AdamW;
    let (_g, c, n) = streams();
    let mut rng = Rng::new(10);
    let len = 1000;
    let (p0, m0) = (rng.normal_vec(len, 1.0), rng.normal_vec(len, 0.1));
    let v0: Vec<f32> = rng.normal_vec(len, 0.1).iter().map(|x| x * x).collect();
    let grads: Vec<Vec<f32>> = (0..3).map(|_| rng.normal_vec(len, 1.0)).collect();
    let hp = AdamW {
        lr: 3e-3,
        weight_decay: 0.1,
        ..AdamW::default()
    };
    let run = |s: &Stream, first: u64| {
        let (mut p, mut m, mut v) = (up(s, &p0), up(s, &m0), up(s, &v0));
        for (i, g) in grads.iter().enumerate() {
            let gb = up(s, g);
            ops::adamw_step(
                s,
                &mut p.view_mut(),
                &gb.view(),
                &mut m.view_mut(),
                &mut v.view_mut(),
                first + i as u64,
                &hp,
            )
            .unwrap();
        }
        (down(s, &p), down(s, &m), down(s, &v))
    };
    let (cr, nr) = (run(&c, 5), run(&n, 5));
    // The op takes its hyper-parameters as f32: 1 - f32(0.999) is off by 1.3e-5 relative
    // from 1 - 0.999, which the v update (and through it the parameters) inherits.
    for (what, e) in [
        ("params", rel_l2(&nr.0, &cr.0)),
        ("m", rel_l2(&nr.1, &cr.1)),
        ("v", rel_l2(&nr.2, &cr.2)),
    ] {
        assert!(e <= 2e-5, "{what}: rel L2 {e:e}");
    }
    // The step reached the op as t - 1 (the op adds 1): the CPU run one step later, whose
    // bias corrections differ, is far from the NPU's.
    let later = run(&c, 6);
    let e = rel_l2(&nr.0, &later.0);
    assert!(e > 1e-4, "steps off by one are indistinguishable: {e:e}");
}

fn attention<E: Float>(conv: impl Fn(&[f32]) -> Vec<E>, tol_fwd: f64, tol_bwd: f64) {
    use cannon_kernels::attention::{lse_len_npu, QkvBuf, QkvGradBuf, VarlenAttention};
    let (_g, c, n) = streams();
    let mut rng = Rng::new(11);
    // Three sequences (one of them empty), GQA 4 q heads over 2 kv heads.
    let cu = [5usize, 5, 12, 19];
    let (t, hq, hkv, d) = (19, 4, 2, 16);
    let q = conv(&rng.normal_vec(t * hq * d, 1.0));
    let k = conv(&rng.normal_vec(t * hkv * d, 1.0));
    let v = conv(&rng.normal_vec(t * hkv * d, 1.0));
    let dout = conv(&rng.normal_vec(t * hq * d, 1.0));
    for causal in [true, false] {
        let a = VarlenAttention::new(&cu, t, hq, hkv, d, causal);
        let run = |s: &Stream, lse_len: usize| {
            let (qb, kb, vb, db) = (up(s, &q), up(s, &k), up(s, &v), up(s, &dout));
            let x = QkvBuf {
                q: &qb.view(),
                k: &kb.view(),
                v: &vb.view(),
            };
            let mut out = DeviceBuffer::<E>::alloc(s, q.len()).unwrap();
            let mut lse = DeviceBuffer::<f32>::alloc(s, lse_len).unwrap();
            ops::attention_forward(s, &a, x, &mut out.view_mut(), &mut lse.view_mut()).unwrap();
            let (mut dq, mut dk, mut dv) = (
                DeviceBuffer::<E>::alloc(s, q.len()).unwrap(),
                DeviceBuffer::<E>::alloc(s, k.len()).unwrap(),
                DeviceBuffer::<E>::alloc(s, v.len()).unwrap(),
            );
            let g = QkvGradBuf {
                dq: &mut dq.view_mut(),
                dk: &mut dk.view_mut(),
                dv: &mut dv.view_mut(),
            };
            ops::attention_backward(s, &a, x, &out.view(), &lse.view(), &db.view(), g).unwrap();
            (down(s, &out), down(s, &dq), down(s, &dk), down(s, &dv))
        };
        let cr = run(&c, t * hq);
        let nr = run(&n, lse_len_npu(&a));
        let e = rel_l2(&f64s(&nr.0), &f64s(&cr.0));
        assert!(
            e <= tol_fwd,
            "{} causal {causal}: out rel L2 {e:e}",
            E::DTYPE
        );
        for (what, a, b) in [
            ("dq", &nr.1, &cr.1),
            ("dk", &nr.2, &cr.2),
            ("dv", &nr.3, &cr.3),
        ] {
            let e = rel_l2(&f64s(a), &f64s(b));
            assert!(
                e <= tol_bwd,
                "{} causal {causal}: {what} rel L2 {e:e}",
                E::DTYPE
            );
        }
    }
}

#[test]
fn flash_attention_matches_the_cpu() {
    // The emulator runs the CPU kernel; the only difference is the saved statistics' round
    // trip (lse as softmaxMax with softmaxSum = 1), exact in f32.
    attention::<f32>(|v| v.to_vec(), 1e-6, 1e-6);
    attention::<bf16>(bf, 1e-6, 1e-6);
}

#[test]
fn grad_norm_pieces_match_the_cpu() {
    let (_g, c, n) = streams();
    let mut rng = Rng::new(12);
    // One view of several 4096-element rows and a tail, one short view.
    let a = rng.normal_vec(3 * 4096 + 100, 1.0);
    let b = rng.normal_vec(77, 3.0);
    let run = |s: &Stream| {
        let (mut ab, mut bb) = (up(s, &a), up(s, &b));
        let ss = ops::grad_sum_squares(s, &[ab.view(), bb.view()]).unwrap();
        ops::scale_grads(s, &mut [ab.view_mut(), bb.view_mut()], 0.37).unwrap();
        (ss, down(s, &ab), down(s, &bb))
    };
    let (cr, nr) = (run(&c), run(&n));
    // f32 partial sums of 4096 squares against the CPU's f64: ~1e-7 relative.
    assert!((nr.0 - cr.0).abs() / cr.0 <= 1e-6, "{} vs {}", nr.0, cr.0);
    assert_eq!(nr.1, cr.1);
    assert_eq!(nr.2, cr.2);
}

fn index_ops<E: Float>(conv: impl Fn(&[f32]) -> Vec<E>) {
    use cannon_kernels::index::TransposeDims;
    let (_g, c, n) = streams();
    let mut rng = Rng::new(13);
    let (r, d) = (17, 12);
    let base = conv(&rng.normal_vec(r * d, 1.0));
    let idx = [3usize, 0, 16, 3, 9];
    let src = conv(&rng.normal_vec(idx.len() * d, 1.0));
    let td = TransposeDims {
        batch: 3,
        rows: 5,
        cols: 7,
    };
    let tx = conv(&rng.normal_vec(3 * 5 * 7, 1.0));
    let run = |s: &Stream| {
        let (bb, sb) = (up(s, &base), up(s, &src));
        let mut g = DeviceBuffer::<E>::alloc(s, idx.len() * d).unwrap();
        ops::gather_rows(s, &mut g.view_mut(), &bb.view(), &idx, d).unwrap();
        let mut sc = up(s, &base);
        ops::scatter_rows(s, &mut sc.view_mut(), &sb.view(), &idx, d).unwrap();
        let mut sa = up(s, &base);
        ops::scatter_add_rows(s, &mut sa.view_mut(), &sb.view(), &idx, d).unwrap();
        let mut z = up(s, &base);
        ops::zero_rows(s, &mut z.view_mut(), &idx, d).unwrap();
        let xb = up(s, &tx);
        let mut t = DeviceBuffer::<E>::alloc(s, tx.len()).unwrap();
        ops::transpose(s, &mut t.view_mut(), &xb.view(), td).unwrap();
        [
            down(s, &g),
            down(s, &sc),
            down(s, &sa),
            down(s, &z),
            down(s, &t),
        ]
    };
    let (cr, nr) = (run(&c), run(&n));
    for (i, what) in ["gather", "scatter", "scatter_add", "zero", "transpose"]
        .iter()
        .enumerate()
    {
        if *what == "scatter_add" {
            // Repeated index 3: the CPU rounds after each source row, the NPU once per row.
            let e = rel_l2(&f64s(&nr[i]), &f64s(&cr[i]));
            let tol = if E::DTYPE == cannon_runtime::DType::F32 {
                1e-6
            } else {
                4e-3
            };
            assert!(e <= tol, "{} {what}: rel L2 {e:e}", E::DTYPE);
        } else {
            assert_eq!(
                f64s(&nr[i]),
                f64s(&cr[i]),
                "{} {what} moves values exactly",
                E::DTYPE
            );
        }
    }
}

#[test]
fn index_ops_match_the_cpu() {
    index_ops::<f32>(|v| v.to_vec());
    index_ops::<bf16>(bf);
}

fn patch_embed<X: Float>(p: Precision, conv: impl Fn(&[f32]) -> Vec<X>, tol: f64) {
    use cannon_kernels::patch_embed::{PatchEmbedGradBufs, PatchGeom};
    let (_g, c, n) = streams();
    let mut rng = Rng::new(14);
    // A padded 3 x 20 x 24 image whose real 18 x 21 region crops to 4 x 5 patches of 4.
    let g = PatchGeom {
        channels: 3,
        height: 20,
        width: 24,
        h: 18,
        w: 21,
        patch: 4,
    };
    let dm = 10;
    let px = conv(&rng.normal_vec(3 * 20 * 24, 1.0));
    let w = conv(&rng.normal_vec(dm * g.patch_len(), 0.2));
    let dout = conv(&rng.normal_vec(g.num_patches() * dm, 1.0));
    let (dw0, dp0) = (
        rng.normal_vec(dm * g.patch_len(), 1.0),
        rng.normal_vec(3 * 20 * 24, 1.0),
    );
    let run = |s: &Stream| {
        let (pb, wb, db) = (up(s, &px), up(s, &w), up(s, &dout));
        let mut out = DeviceBuffer::<f32>::alloc(s, g.num_patches() * dm).unwrap();
        ops::patch_embed_forward(s, p, &mut out.view_mut(), &pb.view(), &wb.view(), g, dm).unwrap();
        let (mut dw, mut dp) = (up(s, &dw0), up(s, &dp0));
        let grads = PatchEmbedGradBufs {
            dweight: Some(dw.view_mut()),
            dpixels: Some(dp.view_mut()),
        };
        ops::patch_embed_backward(s, p, grads, &db.view(), &pb.view(), &wb.view(), g, dm).unwrap();
        (down(s, &out), down(s, &dw), down(s, &dp))
    };
    let (cr, nr) = (run(&c), run(&n));
    for (what, e) in [
        ("out", rel_l2(&nr.0, &cr.0)),
        ("dweight", rel_l2(&nr.1, &cr.1)),
        ("dpixels", rel_l2(&nr.2, &cr.2)),
    ] {
        assert!(e <= tol, "{p} {what}: rel L2 {e:e}");
    }
    // Pixels outside the cropped region keep their gradient untouched.
    assert_eq!(nr.2[20 * 24 - 1], dp0[20 * 24 - 1]);
}

#[test]
fn patch_embed_matches_the_cpu() {
    patch_embed::<f32>(Precision::F32, |v| v.to_vec(), 1e-6);
    patch_embed::<f32>(Precision::Bf16, |v| v.to_vec(), 1e-6);
    patch_embed::<bf16>(Precision::Bf16, bf, 1e-6);
}

#[test]
fn gelu_is_a_typed_pending_error_on_the_npu() {
    // aclnnGeluV2 / aclnnGeluBackwardV2 are not in the bindings: a named error, never a host
    // fallback or a wrong answer.
    let (_g, _, n) = streams();
    let x = up(&n, &[0.5f32; 8]);
    let mut y = DeviceBuffer::<f32>::alloc(&n, 8).unwrap();
    let e = ops::gelu_forward(&n, &mut y.view_mut(), &x.view()).unwrap_err();
    assert!(
        matches!(
            &e,
            KernelError::Unsupported {
                op: "gelu_forward",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("aclnnGeluV2"), "{e}");
}

/// The emulator's count of live aclnn descriptors and executors (a test hook it exports).
fn live_aclnn_objects() -> u64 {
    type Live = unsafe extern "C" fn() -> u64;
    let lib = cannon_sys::loader::library(cannon_sys::Lib::NnopBase).unwrap();
    let f = lib.symbol(c"cannon_emu_live_aclnn_objects").unwrap();
    // SAFETY: the emulator exports the hook with this signature.
    let f: Live = unsafe { std::mem::transmute::<*mut std::ffi::c_void, Live>(f.as_ptr()) };
    // SAFETY: no arguments; it reads the emulator's registries.
    unsafe { f() }
}

#[test]
fn every_descriptor_and_executor_is_released() {
    use cannon_kernels::attention::{lse_len_npu, QkvBuf, QkvGradBuf, VarlenAttention};
    use cannon_kernels::cross_entropy::LossNorm;
    let (_g, _, n) = streams();
    if !emu() {
        eprintln!("skipped on the installed CANN: the count is an emulator hook");
        return;
    }
    // Tests hold the device lock for their whole body, so nothing else is in flight.
    let before = live_aclnn_objects();
    let mut rng = Rng::new(15);
    let d = LinearDims {
        t: 8,
        d_in: 16,
        d_out: 24,
    };
    let (x, w) = (
        up(&n, &rng.normal_vec(8 * 16, 1.0)),
        up(&n, &rng.normal_vec(24 * 16, 1.0)),
    );
    let mut y = DeviceBuffer::<f32>::alloc(&n, 8 * 24).unwrap();
    ops::linear_forward(
        &n,
        Precision::Bf16,
        &mut y.view_mut(),
        &x.view(),
        &w.view(),
        None,
        d,
    )
    .unwrap();
    let mut dx = DeviceBuffer::<f32>::alloc_zeros(&n, 8 * 16).unwrap();
    let grads = LinearGradBufs {
        dx: Some(dx.view_mut()),
        dw: None,
        db: None,
    };
    ops::linear_backward(
        &n,
        Precision::F32,
        grads,
        &y.view(),
        &x.view(),
        &w.view(),
        d,
    )
    .unwrap();
    ops::cross_entropy_in_place(
        &n,
        &mut y.view_mut(),
        &[1, 2, 3, -100, 4, 5, 6, 7],
        24,
        LossNorm::Mean,
    )
    .unwrap();
    let cu = [3usize, 8];
    let a = VarlenAttention::new(&cu, 8, 2, 1, 8, true);
    let (q, k) = (
        up(&n, &rng.normal_vec(8 * 2 * 8, 1.0)),
        up(&n, &rng.normal_vec(8 * 8, 1.0)),
    );
    let qkv = QkvBuf {
        q: &q.view(),
        k: &k.view(),
        v: &k.view(),
    };
    let mut o = DeviceBuffer::<f32>::alloc(&n, 8 * 2 * 8).unwrap();
    let mut lse = DeviceBuffer::<f32>::alloc(&n, lse_len_npu(&a)).unwrap();
    ops::attention_forward(&n, &a, qkv, &mut o.view_mut(), &mut lse.view_mut()).unwrap();
    let (mut dq, mut dk, mut dv) = (
        DeviceBuffer::<f32>::alloc(&n, 128).unwrap(),
        DeviceBuffer::<f32>::alloc(&n, 64).unwrap(),
        DeviceBuffer::<f32>::alloc(&n, 64).unwrap(),
    );
    let g = QkvGradBuf {
        dq: &mut dq.view_mut(),
        dk: &mut dk.view_mut(),
        dv: &mut dv.view_mut(),
    };
    ops::attention_backward(&n, &a, qkv, &o.view(), &lse.view(), &q.view(), g).unwrap();
    // A failing call releases what it made too.
    let mut bad = up(&n, &[1.0f32; 64]);
    ops::add_into(
        &n,
        &mut bad.slice_mut(1..64).unwrap(),
        &x.slice(0..63).unwrap(),
    )
    .unwrap_err();
    n.synchronize().unwrap();
    assert_eq!(
        live_aclnn_objects(),
        before,
        "aclnn descriptors or executors leaked"
    );
    assert!(cannon_kernels::backend::aclnn::take_drop_errors().is_empty());
}
