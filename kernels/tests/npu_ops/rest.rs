//! Attention, grad-norm pieces, index ops, patch embedding, and the release of every
//! descriptor.

use crate::{bf, down, emu, f64s, streams, up};
use cannon_kernels::linear::{LinearDims, LinearGradBufs};
use cannon_kernels::ops;
use cannon_kernels::testutil::{rel_l2, Rng};
use cannon_kernels::Precision;
use cannon_runtime::{DeviceBuffer, Float, Stream};
use half::bf16;

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
            e <= crate::bar(tol_fwd, E::DTYPE == cannon_runtime::DType::BF16),
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
                e <= crate::bar(tol_bwd, E::DTYPE == cannon_runtime::DType::BF16),
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
    assert!(
        (nr.0 - cr.0).abs() / cr.0 <= crate::bar(1e-6, false),
        "{} vs {}",
        nr.0,
        cr.0
    );
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
            assert!(
                e <= crate::bar(tol, E::DTYPE == cannon_runtime::DType::BF16),
                "{} {what}: rel L2 {e:e}",
                E::DTYPE
            );
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
        assert!(
            e <= crate::bar(tol, p == Precision::Bf16),
            "{p} {what}: rel L2 {e:e}"
        );
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

/// The emulator's count of live aclnn descriptors and executors (a test hook it exports).
fn live_aclnn_objects() -> u64 {
    type Live = unsafe extern "C" fn() -> u64;
    let lib = cannon_sys::loader::library(cannon_sys::Lib::NnopBase).unwrap();
    let f = lib.symbol(c"cannon_emu_live_aclnn_objects").unwrap();
    // SAFETY: the emulator exports the hook with this signature.
    let f: Live = unsafe { std::mem::transmute::<*mut std::ffi::c_void, Live>(f.as_ptr()) };
    // SAFETY: no arguments; it reads the emulator's registries.
    let live = unsafe { f() };
    // Not a tail call: as one, the release build jumped through the pointer after popping the
    // frame (`jmp *-0x98(%rsp)`: a read 152 bytes below the stack pointer, past the red zone),
    // which memcheck rightly reports as an invalid read.
    std::hint::black_box(live)
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
