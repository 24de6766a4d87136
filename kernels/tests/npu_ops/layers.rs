//! RMSNorm, SwiGLU, RoPE, embedding, cross-entropy and AdamW.

use crate::{bf, down, f64s, streams, up};
use cannon_kernels::ops;
use cannon_kernels::testutil::{rel_l2, Rng};
use cannon_kernels::KernelError;
use cannon_runtime::{DeviceBuffer, Float, Stream};
use half::bf16;

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
        assert!(
            e <= crate::bar(tol, E::DTYPE == cannon_runtime::DType::BF16),
            "{}: {what}: rel L2 {e:e}",
            E::DTYPE
        );
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
        assert!(
            e <= crate::bar(tol, E::DTYPE == cannon_runtime::DType::BF16),
            "{}: {what}: rel L2 {e:e}",
            E::DTYPE
        );
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
        assert!(
            e <= crate::bar(tol, E::DTYPE == cannon_runtime::DType::BF16),
            "{} forward: rel L2 {e:e}",
            E::DTYPE
        );
        let e = rel_l2(&f64s(&nr.1), &f64s(&cr.1));
        assert!(
            e <= crate::bar(tol, E::DTYPE == cannon_runtime::DType::BF16),
            "{} backward: rel L2 {e:e}",
            E::DTYPE
        );
        // The backward undoes the forward: x comes back (to rounding).
        let e = rel_l2(&f64s(&nr.1), &f64s(&x));
        assert!(
            e <= crate::bar(10.0 * tol, E::DTYPE == cannon_runtime::DType::BF16),
            "{} round trip: rel L2 {e:e}",
            E::DTYPE
        );
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
    assert!(
        e <= crate::bar(1e-6, E::DTYPE == cannon_runtime::DType::BF16),
        "{} backward: rel L2 {e:e}",
        E::DTYPE
    );
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
            assert!(
                e <= crate::bar(1e-6, false),
                "{norm:?} {what} loss {} vs {}",
                b.loss,
                a.loss
            );
        }
        for (what, e) in [
            ("d_logits", rel_l2(&nr.1, &cr.1)),
            ("in place", rel_l2(&nr.3, &cr.3)),
            ("dh", rel_l2(&nr.5, &cr.5)),
            ("dw", rel_l2(&nr.6, &cr.6)),
        ] {
            assert!(
                e <= crate::bar(1e-5, false),
                "{norm:?} {what}: rel L2 {e:e}"
            );
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
        assert!(e <= crate::bar(2e-5, false), "{what}: rel L2 {e:e}");
    }
    // The step reached the op as t - 1 (the op adds 1): the CPU run one step later, whose
    // bias corrections differ, is far from the NPU's.
    let later = run(&c, 6);
    let e = rel_l2(&nr.0, &later.0);
    assert!(e > 1e-4, "steps off by one are indistinguishable: {e:e}");
}
