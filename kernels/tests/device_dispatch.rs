//! The device-level entry points (`cannon_kernels::ops`, the one dispatch point) against the
//! slice-level kernels, and the dispatch rules for NPU operands.
//!
//! On CPU buffers a device-level call runs the slice-level kernel on the buffers' host slices,
//! so its results must be bit-identical to the slice-level call on the same data: these tests
//! guard the plumbing (argument order, which buffer is which, views with an offset), not the
//! numerics, which each op's own tests check against float64 references. Every output starts
//! from random contents and every input is distinct random data, so a swapped argument, an
//! unwritten output or a lost accumulation changes the bits.
//!
//! NPU buffers cannot be allocated without CANN, so the NPU side is checked through
//! `select_on` (device lists, no stream needed).

use cannon_kernels::cross_entropy::{ChunkedLogits, LossNorm, IGNORE_INDEX};
use cannon_kernels::gemm::{Dims, Trans};
use cannon_kernels::linear::{LinearDims, LinearGrads};
use cannon_kernels::patch_embed::{PatchEmbedGrads, PatchGeom};
use cannon_kernels::rope::RopeTable;
use cannon_kernels::testutil::Rng;
use cannon_kernels::{
    adamw, cast, cross_entropy, embedding, gelu, gemm, grad_clip, linear, ops, patch_embed,
    rmsnorm, rope, swiglu, KernelError, Precision,
};
use cannon_runtime::Float;
use cannon_runtime::{DeviceBuffer, Stream};
use half::bf16;
use std::ops::Range;

/// NPU operands: the dispatch rules.
#[path = "device_dispatch/npu.rs"]
mod npu;

/// Meta operands: checked, nothing computed.
#[path = "device_dispatch/meta.rs"]
mod meta;

/// Every op's argument rules on the meta device, as the CPU applies them.
#[path = "device_dispatch/meta_checks.rs"]
mod meta_checks;

fn elems<E: Float>(rng: &mut Rng, n: usize) -> Vec<E> {
    rng.normal_vec(n, 1.0)
        .into_iter()
        .map(E::from_f32)
        .collect()
}

fn buf<T: cannon_runtime::Element>(s: &Stream, v: &[T]) -> DeviceBuffer<T> {
    DeviceBuffer::clone_htod(s, v).unwrap()
}

fn host<T: cannon_runtime::Element>(s: &Stream, b: &DeviceBuffer<T>) -> Vec<T> {
    b.clone_dtoh(s).unwrap()
}

/// Bit-identical, and not trivially so: the result must differ from the output's contents
/// before the call (`before`), so a call that wrote nothing cannot pass.
#[track_caller]
fn assert_same<T: cannon_runtime::Element>(what: &str, device: &[T], slice: &[T], before: &[T]) {
    let bytes = |v: &[T]| bytemuck::cast_slice::<T, u8>(v).to_vec();
    assert_eq!(
        bytes(device),
        bytes(slice),
        "{what}: device-level != slice-level"
    );
    assert_ne!(
        bytes(slice),
        bytes(before),
        "{what}: the call left the output unchanged"
    );
}

// ---------------------------------------------------------------------------------------
// CPU buffers: device level == slice level
// ---------------------------------------------------------------------------------------

fn rmsnorm_case<E: Float>(seed: u64) {
    let (s, mut rng) = (Stream::cpu(), Rng::new(seed));
    let (t, d, eps) = (5, 24, 1e-5);
    let (x, w) = (elems::<E>(&mut rng, t * d), elems::<E>(&mut rng, d));
    let out0 = elems::<E>(&mut rng, t * d);
    let rstd0 = rng.normal_vec(t, 1.0);
    let (mut out, mut rstd) = (out0.clone(), rstd0.clone());
    rmsnorm::host::rmsnorm_forward(&mut out, &mut rstd, &x, &w, d, eps).unwrap();
    let (mut out_b, mut rstd_b) = (buf(&s, &out0), buf(&s, &rstd0));
    let (xb, wb) = (buf(&s, &x), buf(&s, &w));
    ops::rmsnorm_forward(
        &s,
        &mut out_b.view_mut(),
        &mut rstd_b.view_mut(),
        &xb.view(),
        &wb.view(),
        d,
        eps,
    )
    .unwrap();
    assert_same("rmsnorm out", &host(&s, &out_b), &out, &out0);
    assert_same("rmsnorm rstd", &host(&s, &rstd_b), &rstd, &rstd0);

    let dout = elems::<E>(&mut rng, t * d);
    let (dx0, dw0) = (elems::<E>(&mut rng, t * d), rng.normal_vec(d, 1.0));
    let (mut dx, mut dw) = (dx0.clone(), dw0.clone());
    rmsnorm::host::rmsnorm_backward(&mut dx, &mut dw, &dout, &x, &w, &rstd, d).unwrap();
    let (mut dx_b, mut dw_b) = (buf(&s, &dx0), buf(&s, &dw0));
    ops::rmsnorm_backward(
        &s,
        &mut dx_b.view_mut(),
        &mut dw_b.view_mut(),
        &buf(&s, &dout).view(),
        &xb.view(),
        &wb.view(),
        &rstd_b.view(),
        d,
    )
    .unwrap();
    assert_same("rmsnorm dx", &host(&s, &dx_b), &dx, &dx0);
    assert_same("rmsnorm dweight", &host(&s, &dw_b), &dw, &dw0);
}

#[test]
fn rmsnorm_device_matches_slice() {
    rmsnorm_case::<f32>(1);
    rmsnorm_case::<bf16>(2);
}

fn swiglu_gelu_case<E: Float>(seed: u64) {
    let (s, mut rng) = (Stream::cpu(), Rng::new(seed));
    let n = 37;
    let (gate, up, dh) = (
        elems::<E>(&mut rng, n),
        elems(&mut rng, n),
        elems(&mut rng, n),
    );
    let (gb, ub, dhb) = (buf(&s, &gate), buf(&s, &up), buf(&s, &dh));

    let h0 = elems::<E>(&mut rng, n);
    let mut h = h0.clone();
    swiglu::host::swiglu_forward(&mut h, &gate, &up).unwrap();
    let mut h_b = buf(&s, &h0);
    ops::swiglu_forward(&s, &mut h_b.view_mut(), &gb.view(), &ub.view()).unwrap();
    assert_same("swiglu h", &host(&s, &h_b), &h, &h0);

    let (dg0, du0) = (elems::<E>(&mut rng, n), elems::<E>(&mut rng, n));
    let (mut dg, mut du) = (dg0.clone(), du0.clone());
    swiglu::host::swiglu_backward(&mut dg, &mut du, &dh, &gate, &up).unwrap();
    let (mut dg_b, mut du_b) = (buf(&s, &dg0), buf(&s, &du0));
    ops::swiglu_backward(
        &s,
        &mut dg_b.view_mut(),
        &mut du_b.view_mut(),
        &dhb.view(),
        &gb.view(),
        &ub.view(),
    )
    .unwrap();
    assert_same("swiglu d_gate", &host(&s, &dg_b), &dg, &dg0);
    assert_same("swiglu d_up", &host(&s, &du_b), &du, &du0);

    // GELU on the same data: x = gate, dy = dh.
    let mut y = h0.clone();
    gelu::host::gelu_forward(&mut y, &gate).unwrap();
    let mut y_b = buf(&s, &h0);
    ops::gelu_forward(&s, &mut y_b.view_mut(), &gb.view()).unwrap();
    assert_same("gelu y", &host(&s, &y_b), &y, &h0);
    let mut dx = dg0.clone();
    gelu::host::gelu_backward(&mut dx, &dh, &gate).unwrap();
    let mut dx_b = buf(&s, &dg0);
    ops::gelu_backward(&s, &mut dx_b.view_mut(), &dhb.view(), &gb.view()).unwrap();
    assert_same("gelu dx", &host(&s, &dx_b), &dx, &dg0);
}

#[test]
fn swiglu_and_gelu_device_match_slice() {
    swiglu_gelu_case::<f32>(3);
    swiglu_gelu_case::<bf16>(4);
}

#[test]
fn casts_device_match_slice() {
    let (s, mut rng) = (Stream::cpu(), Rng::new(5));
    let n = 41;
    let src = rng.normal_vec(n, 3.0);
    let dst0 = elems::<bf16>(&mut rng, n);
    let mut dst = dst0.clone();
    cast::host::cast(&src, &mut dst).unwrap();
    let mut dst_b = buf(&s, &dst0);
    ops::cast(&s, &buf(&s, &src).view(), &mut dst_b.view_mut()).unwrap();
    assert_same("cast_f32_to_bf16", &host(&s, &dst_b), &dst, &dst0);

    let wide0 = rng.normal_vec(n, 1.0);
    let mut wide = wide0.clone();
    cast::host::cast(&dst, &mut wide).unwrap();
    let mut wide_b = buf(&s, &wide0);
    ops::cast(&s, &buf(&s, &dst).view(), &mut wide_b.view_mut()).unwrap();
    assert_same("cast_bf16_to_f32", &host(&s, &wide_b), &wide, &wide0);

    let mut conv = dst0.clone();
    cast::host::cast::<f32, bf16>(&src, &mut conv).unwrap();
    let mut conv_b = buf(&s, &dst0);
    ops::cast(&s, &buf(&s, &src).view(), &mut conv_b.view_mut()).unwrap();
    assert_same("cast<f32, bf16>", &host(&s, &conv_b), &conv, &dst0);
}

#[test]
fn adamw_device_matches_slice() {
    let (s, mut rng) = (Stream::cpu(), Rng::new(6));
    let n = 300;
    let hp = adamw::AdamW {
        lr: 1e-2,
        ..Default::default()
    };
    let (p0, m0) = (rng.normal_vec(n, 1.0), rng.normal_vec(n, 0.1));
    let v0: Vec<f32> = rng.normal_vec(n, 0.1).iter().map(|x| x * x).collect();
    let (mut p, mut m, mut v) = (p0.clone(), m0.clone(), v0.clone());
    let (mut pb, mut mb, mut vb) = (buf(&s, &p0), buf(&s, &m0), buf(&s, &v0));
    for step in 1..=2 {
        let g = rng.normal_vec(n, 1.0);
        adamw::host::adamw_step(&mut p, &g, &mut m, &mut v, step, &hp).unwrap();
        ops::adamw_step(
            &s,
            &mut pb.view_mut(),
            &buf(&s, &g).view(),
            &mut mb.view_mut(),
            &mut vb.view_mut(),
            step,
            &hp,
        )
        .unwrap();
    }
    assert_same("adamw params", &host(&s, &pb), &p, &p0);
    assert_same("adamw m", &host(&s, &mb), &m, &m0);
    assert_same("adamw v", &host(&s, &vb), &v, &v0);
}

fn embedding_case<E: Float>(seed: u64) {
    let (s, mut rng) = (Stream::cpu(), Rng::new(seed));
    let (vocab, d, t) = (7, 6, 9);
    let ids: Vec<u32> = (0..t).map(|_| rng.below(vocab) as u32).collect();
    let w = elems::<E>(&mut rng, vocab * d);
    let out0 = elems::<E>(&mut rng, t * d);
    let mut out = out0.clone();
    embedding::host::embedding_forward(&mut out, &ids, &w, d).unwrap();
    let mut out_b = buf(&s, &out0);
    ops::embedding_forward(&s, &mut out_b.view_mut(), &ids, &buf(&s, &w).view(), d).unwrap();
    assert_same("embedding out", &host(&s, &out_b), &out, &out0);

    let dout = elems::<E>(&mut rng, t * d);
    let dw0 = rng.normal_vec(vocab * d, 1.0);
    let mut dw = dw0.clone();
    embedding::host::embedding_backward(&mut dw, &dout, &ids, d).unwrap();
    let mut dw_b = buf(&s, &dw0);
    ops::embedding_backward(&s, &mut dw_b.view_mut(), &buf(&s, &dout).view(), &ids, d).unwrap();
    assert_same("embedding dweight", &host(&s, &dw_b), &dw, &dw0);
}

#[test]
fn embedding_device_matches_slice() {
    embedding_case::<f32>(7);
    embedding_case::<bf16>(8);
}

#[test]
fn gemm_device_matches_slice() {
    let (s, mut rng) = (Stream::cpu(), Rng::new(9));
    // A stored transposed [k, m] with a padded stride, B as [k, n], C with a padded stride.
    let d = Dims { m: 5, n: 7, k: 9 };
    let (lda, ldb, ldc) = (d.m + 2, d.n, d.n + 3);
    let a = rng.normal_vec((d.k - 1) * lda + d.m, 1.0);
    let b = rng.normal_vec((d.k - 1) * ldb + d.n, 1.0);
    let c0 = rng.normal_vec((d.m - 1) * ldc + d.n, 1.0);
    let (ta, tb, alpha, beta) = (Trans::T, Trans::N, 1.5, 0.5);

    let mut c = c0.clone();
    gemm::host::gemm_f32(ta, tb, d, alpha, &a, lda, &b, ldb, beta, &mut c, ldc).unwrap();
    let (ab, bb, mut cb) = (buf(&s, &a), buf(&s, &b), buf(&s, &c0));
    let (av, bv) = (ab.view(), bb.view());
    ops::gemm(
        &s,
        Precision::F32,
        ta,
        tb,
        d,
        alpha,
        &av,
        lda,
        &bv,
        ldb,
        beta,
        &mut cb.view_mut(),
        ldc,
    )
    .unwrap();
    assert_same("gemm_f32 C", &host(&s, &cb), &c, &c0);

    // bf16 with a bf16 A and an f32 B (rounded while packing).
    let a16: Vec<bf16> = a.iter().map(|&x| bf16::from_f32(x)).collect();
    let mut c = c0.clone();
    gemm::host::gemm_bf16(ta, tb, d, alpha, &a16, lda, &b, ldb, beta, &mut c, ldc).unwrap();
    let (a16b, mut cb) = (buf(&s, &a16), buf(&s, &c0));
    let a16v = a16b.view();
    ops::gemm(
        &s,
        Precision::Bf16,
        ta,
        tb,
        d,
        alpha,
        &a16v,
        lda,
        &bv,
        ldb,
        beta,
        &mut cb.view_mut(),
        ldc,
    )
    .unwrap();
    assert_same("gemm_bf16 C", &host(&s, &cb), &c, &c0);
}

#[test]
fn linear_device_matches_slice() {
    let (s, mut rng) = (Stream::cpu(), Rng::new(10));
    let d = LinearDims {
        t: 6,
        d_in: 10,
        d_out: 8,
    };
    let (x, w, b) = (
        rng.normal_vec(d.t * d.d_in, 1.0),
        rng.normal_vec(d.d_out * d.d_in, 1.0),
        rng.normal_vec(d.d_out, 1.0),
    );
    let (xb, wb, bb) = (buf(&s, &x), buf(&s, &w), buf(&s, &b));
    let y0 = rng.normal_vec(d.t * d.d_out, 1.0);

    let mut y = y0.clone();
    linear::host::linear_forward(Precision::F32, &mut y, &x, &w, Some(&b), d).unwrap();
    let mut yb = buf(&s, &y0);
    let bv = bb.view();
    ops::linear_forward(
        &s,
        Precision::F32,
        &mut yb.view_mut(),
        &xb.view(),
        &wb.view(),
        Some(&bv),
        d,
    )
    .unwrap();
    assert_same("linear y", &host(&s, &yb), &y, &y0);

    // dW lands in a window of a larger flat gradient buffer: the rest must stay untouched.
    let dy = rng.normal_vec(d.t * d.d_out, 1.0);
    let (dx0, db0) = (
        rng.normal_vec(d.t * d.d_in, 1.0),
        rng.normal_vec(d.d_out, 1.0),
    );
    let flat0 = rng.normal_vec(d.d_out * d.d_in + 13, 1.0);
    let win = 5..5 + d.d_out * d.d_in;
    let (mut dx, mut flat, mut db) = (dx0.clone(), flat0.clone(), db0.clone());
    let g = LinearGrads {
        dx: Some(&mut dx),
        dw: Some(&mut flat[win.clone()]),
        db: Some(&mut db),
    };
    linear::host::linear_backward(Precision::F32, g, &dy, &x, &w, d).unwrap();
    let (mut dxb, mut flatb, mut dbb) = (buf(&s, &dx0), buf(&s, &flat0), buf(&s, &db0));
    let g = linear::LinearGradBufs {
        dx: Some(dxb.view_mut()),
        dw: Some(flatb.slice_mut(win).unwrap()),
        db: Some(dbb.view_mut()),
    };
    ops::linear_backward(
        &s,
        Precision::F32,
        g,
        &buf(&s, &dy).view(),
        &xb.view(),
        &wb.view(),
        d,
    )
    .unwrap();
    assert_same("linear dx", &host(&s, &dxb), &dx, &dx0);
    assert_same("linear dw (window)", &host(&s, &flatb), &flat, &flat0);
    assert_same("linear db", &host(&s, &dbb), &db, &db0);
}

#[test]
fn linear_bf16_device_matches_slice() {
    let (s, mut rng) = (Stream::cpu(), Rng::new(11));
    let d = LinearDims {
        t: 4,
        d_in: 12,
        d_out: 6,
    };
    let x = elems::<bf16>(&mut rng, d.t * d.d_in);
    let w = elems::<bf16>(&mut rng, d.d_out * d.d_in);
    let b = elems::<bf16>(&mut rng, d.d_out);
    let (xb, wb, bb) = (buf(&s, &x), buf(&s, &w), buf(&s, &b));
    let bv = bb.view();

    let y0 = rng.normal_vec(d.t * d.d_out, 1.0);
    let mut y = y0.clone();
    linear::host::linear_forward(Precision::Bf16, &mut y, &x, &w, Some(&b), d).unwrap();
    let mut yb = buf(&s, &y0);
    ops::linear_forward(
        &s,
        Precision::Bf16,
        &mut yb.view_mut(),
        &xb.view(),
        &wb.view(),
        Some(&bv),
        d,
    )
    .unwrap();
    assert_same("linear_bf16 y", &host(&s, &yb), &y, &y0);

    let y0 = elems::<bf16>(&mut rng, d.t * d.d_out);
    let mut y = y0.clone();
    linear::host::linear_forward(Precision::Bf16, &mut y, &x, &w, Some(&b), d).unwrap();
    let mut yb = buf(&s, &y0);
    let (xv, wv) = (xb.view(), wb.view());
    ops::linear_forward(
        &s,
        Precision::Bf16,
        &mut yb.view_mut(),
        &xv,
        &wv,
        Some(&bv),
        d,
    )
    .unwrap();
    assert_same("linear_bf16_to_bf16 y", &host(&s, &yb), &y, &y0);

    // f32 dY (rounded in the products), dX and dW only.
    let dy = rng.normal_vec(d.t * d.d_out, 1.0);
    let (dx0, dw0) = (
        rng.normal_vec(d.t * d.d_in, 1.0),
        rng.normal_vec(d.d_out * d.d_in, 1.0),
    );
    let (mut dx, mut dw) = (dx0.clone(), dw0.clone());
    let g = LinearGrads {
        dx: Some(&mut dx),
        dw: Some(&mut dw),
        db: None,
    };
    linear::host::linear_backward(Precision::Bf16, g, &dy, &x, &w, d).unwrap();
    let (mut dxb, mut dwb) = (buf(&s, &dx0), buf(&s, &dw0));
    let g = linear::LinearGradBufs {
        dx: Some(dxb.view_mut()),
        dw: Some(dwb.view_mut()),
        db: None,
    };
    ops::linear_backward(&s, Precision::Bf16, g, &buf(&s, &dy).view(), &xv, &wv, d).unwrap();
    assert_same("linear_bf16 dx", &host(&s, &dxb), &dx, &dx0);
    assert_same("linear_bf16 dw", &host(&s, &dwb), &dw, &dw0);
}

#[test]
fn patch_embed_device_matches_slice() {
    let (s, mut rng) = (Stream::cpu(), Rng::new(12));
    // A 9x8 image in a padded 10x9 buffer, patch 4: a 2x2 grid, the rest cropped.
    let g = PatchGeom {
        channels: 3,
        height: 10,
        width: 9,
        h: 9,
        w: 8,
        patch: 4,
    };
    let dm = 5;
    let px_len = g.channels * g.height * g.width;
    let (px, w) = (
        rng.normal_vec(px_len, 1.0),
        rng.normal_vec(dm * g.patch_len(), 1.0),
    );
    let (pxb, wb) = (buf(&s, &px), buf(&s, &w));
    let out0 = rng.normal_vec(g.num_patches() * dm, 1.0);

    let mut out = out0.clone();
    patch_embed::host::patch_embed_forward(Precision::F32, &mut out, &px, &w, g, dm).unwrap();
    let mut outb = buf(&s, &out0);
    ops::patch_embed_forward(
        &s,
        Precision::F32,
        &mut outb.view_mut(),
        &pxb.view(),
        &wb.view(),
        g,
        dm,
    )
    .unwrap();
    assert_same("patch_embed out", &host(&s, &outb), &out, &out0);

    let dout = rng.normal_vec(g.num_patches() * dm, 1.0);
    let (dw0, dp0) = (rng.normal_vec(w.len(), 1.0), rng.normal_vec(px_len, 1.0));
    let (mut dw, mut dp) = (dw0.clone(), dp0.clone());
    let gr = PatchEmbedGrads {
        dweight: Some(&mut dw),
        dpixels: Some(&mut dp),
    };
    patch_embed::host::patch_embed_backward(Precision::F32, gr, &dout, &px, &w, g, dm).unwrap();
    let (mut dwb, mut dpb) = (buf(&s, &dw0), buf(&s, &dp0));
    let gr = patch_embed::PatchEmbedGradBufs {
        dweight: Some(dwb.view_mut()),
        dpixels: Some(dpb.view_mut()),
    };
    let doutb = buf(&s, &dout);
    ops::patch_embed_backward(
        &s,
        Precision::F32,
        gr,
        &doutb.view(),
        &pxb.view(),
        &wb.view(),
        g,
        dm,
    )
    .unwrap();
    assert_same("patch_embed dweight", &host(&s, &dwb), &dw, &dw0);
    assert_same("patch_embed dpixels", &host(&s, &dpb), &dp, &dp0);

    // bf16 pixels and weights, f32 dOut; dweight only.
    let px16 = elems::<bf16>(&mut rng, px_len);
    let w16 = elems::<bf16>(&mut rng, w.len());
    let (px16b, w16b) = (buf(&s, &px16), buf(&s, &w16));
    let mut out = out0.clone();
    patch_embed::host::patch_embed_forward(Precision::Bf16, &mut out, &px16, &w16, g, dm).unwrap();
    let mut outb = buf(&s, &out0);
    let (pv, wv) = (px16b.view(), w16b.view());
    ops::patch_embed_forward(&s, Precision::Bf16, &mut outb.view_mut(), &pv, &wv, g, dm).unwrap();
    assert_same("patch_embed_bf16 out", &host(&s, &outb), &out, &out0);

    let mut dw = dw0.clone();
    let gr = PatchEmbedGrads {
        dweight: Some(&mut dw),
        dpixels: None,
    };
    patch_embed::host::patch_embed_backward(Precision::Bf16, gr, &dout, &px16, &w16, g, dm)
        .unwrap();
    let mut dwb = buf(&s, &dw0);
    let gr = patch_embed::PatchEmbedGradBufs {
        dweight: Some(dwb.view_mut()),
        dpixels: None,
    };
    ops::patch_embed_backward(&s, Precision::Bf16, gr, &doutb.view(), &pv, &wv, g, dm).unwrap();
    assert_same("patch_embed_bf16 dweight", &host(&s, &dwb), &dw, &dw0);
}

fn rope_case<E: Float>(seed: u64, table: &RopeTable) {
    let (s, mut rng) = (Stream::cpu(), Rng::new(seed));
    let (t, heads) = (5, 3);
    // Slots from 1 on: slot 0 is the identity rotation.
    let pos: Vec<u32> = (0..t)
        .map(|_| 1 + rng.below(table.slots() - 1) as u32)
        .collect();
    let x0 = elems::<E>(&mut rng, t * heads * table.head_dim());
    let mut x = x0.clone();
    rope::host::rope_forward(&mut x, heads, table, &pos).unwrap();
    let mut xb = buf(&s, &x0);
    ops::rope_forward(&s, &mut xb.view_mut(), heads, table, &pos).unwrap();
    assert_same("rope x", &host(&s, &xb), &x, &x0);

    let mut dx = x0.clone();
    rope::host::rope_backward(&mut dx, heads, table, &pos).unwrap();
    let mut dxb = buf(&s, &x0);
    ops::rope_backward(&s, &mut dxb.view_mut(), heads, table, &pos).unwrap();
    assert_same("rope dx", &host(&s, &dxb), &dx, &x0);
}

#[test]
fn rope_device_matches_slice() {
    let text = RopeTable::text(8, 1e4, 16).unwrap();
    let axial = RopeTable::axial(8, 1e4, 4, 4).unwrap();
    rope_case::<f32>(13, &text);
    rope_case::<bf16>(14, &text);
    rope_case::<f32>(15, &axial);
}

#[test]
fn cross_entropy_full_device_matches_slice() {
    let (s, mut rng) = (Stream::cpu(), Rng::new(16));
    let (n, vocab) = (7, 11);
    let logits = rng.normal_vec(n * vocab, 2.0);
    let mut labels: Vec<i32> = (0..n).map(|_| rng.below(vocab) as i32).collect();
    labels[2] = IGNORE_INDEX;
    let lb = buf(&s, &logits);
    for norm in [LossNorm::Mean, LossNorm::Divisor(13.0)] {
        let st = cross_entropy::host::cross_entropy(&logits, &labels, vocab, None, norm).unwrap();
        let dv = ops::cross_entropy(&s, &lb.view(), &labels, vocab, None, norm).unwrap();
        assert_eq!(dv, st, "loss without gradient, {norm:?}");

        let d0 = rng.normal_vec(n * vocab, 1.0);
        let mut d = d0.clone();
        let st = cross_entropy::host::cross_entropy(&logits, &labels, vocab, Some(&mut d), norm)
            .unwrap();
        let mut db = buf(&s, &d0);
        let mut dv_view = db.view_mut();
        let dv =
            ops::cross_entropy(&s, &lb.view(), &labels, vocab, Some(&mut dv_view), norm).unwrap();
        assert_eq!(dv, st, "loss with gradient, {norm:?}");
        assert_same("cross_entropy d_logits", &host(&s, &db), &d, &d0);

        let mut inplace = logits.clone();
        let st = cross_entropy::host::cross_entropy_in_place(&mut inplace, &labels, vocab, norm)
            .unwrap();
        let mut ib = buf(&s, &logits);
        let dv = ops::cross_entropy_in_place(&s, &mut ib.view_mut(), &labels, vocab, norm).unwrap();
        assert_eq!(dv, st, "in-place loss, {norm:?}");
        assert_same("cross_entropy in place", &host(&s, &ib), &inplace, &logits);
    }
}

/// The slice-level lm_head producer the device-level chunked call must reproduce, written
/// here independently with the same `linear` calls.
struct RefLmHead<'a> {
    h: &'a [f32],
    w: &'a [f32],
    dh: &'a mut [f32],
    dw: &'a mut [f32],
    d_model: usize,
    vocab: usize,
}

impl ChunkedLogits for RefLmHead<'_> {
    type Error = KernelError;
    fn logits(&mut self, rows: Range<usize>, out: &mut [f32]) -> Result<(), KernelError> {
        let dm = self.d_model;
        let d = LinearDims {
            t: rows.len(),
            d_in: dm,
            d_out: self.vocab,
        };
        linear::host::linear_forward(
            Precision::F32,
            out,
            &self.h[rows.start * dm..rows.end * dm],
            self.w,
            None,
            d,
        )
    }
    fn backward(&mut self, rows: Range<usize>, dl: &[f32]) -> Result<(), KernelError> {
        let (dm, r) = (
            self.d_model,
            rows.start * self.d_model..rows.end * self.d_model,
        );
        let d = LinearDims {
            t: rows.len(),
            d_in: dm,
            d_out: self.vocab,
        };
        let g = LinearGrads {
            dx: Some(&mut self.dh[r.clone()]),
            dw: Some(&mut *self.dw),
            db: None,
        };
        linear::host::linear_backward(Precision::F32, g, dl, &self.h[r], self.w, d)
    }
}

#[test]
fn cross_entropy_chunked_lm_head_device_matches_slice() {
    let (s, mut rng) = (Stream::cpu(), Rng::new(17));
    let (n, dm, vocab, chunk) = (10, 6, 9, 3);
    let (h, w) = (rng.normal_vec(n * dm, 1.0), rng.normal_vec(vocab * dm, 1.0));
    let mut labels: Vec<i32> = (0..n).map(|_| rng.below(vocab) as i32).collect();
    // Rows 3..6 form an all-ignored chunk (skipped), row 8 an ignored row in a live one.
    for l in &mut labels[3..6] {
        *l = IGNORE_INDEX;
    }
    labels[8] = IGNORE_INDEX;
    let (dh0, dw0) = (rng.normal_vec(n * dm, 1.0), rng.normal_vec(vocab * dm, 1.0));
    let (hb, wb) = (buf(&s, &h), buf(&s, &w));
    for norm in [LossNorm::Mean, LossNorm::Divisor(20.0)] {
        let (mut dh, mut dw) = (dh0.clone(), dw0.clone());
        let mut p = RefLmHead {
            h: &h,
            w: &w,
            dh: &mut dh,
            dw: &mut dw,
            d_model: dm,
            vocab,
        };
        let st =
            cross_entropy::host::cross_entropy_chunked(&mut p, &labels, vocab, chunk, norm, true)
                .unwrap();
        let (mut dhb, mut dwb) = (buf(&s, &dh0), buf(&s, &dw0));
        let grads = cross_entropy::LmHeadGrads {
            dh: Some(dhb.view_mut()),
            dw: Some(dwb.view_mut()),
        };
        let (hv, wv) = (hb.view(), wb.view());
        let dv = ops::cross_entropy_lm_head(&s, &hv, &wv, &labels, dm, vocab, chunk, norm, grads)
            .unwrap();
        assert_eq!(dv, st, "chunked loss, {norm:?}");
        assert_same("chunked dh", &host(&s, &dhb), &dh, &dh0);
        assert_same("chunked dw", &host(&s, &dwb), &dw, &dw0);

        // Without gradients: the loss alone (the producer's backward is never called).
        let nograd = cross_entropy::LmHeadGrads { dh: None, dw: None };
        let dv = ops::cross_entropy_lm_head(&s, &hv, &wv, &labels, dm, vocab, chunk, norm, nograd)
            .unwrap();
        assert_eq!(dv, st, "chunked loss without gradient, {norm:?}");
    }
}

#[test]
fn grad_clip_device_matches_slice() {
    let (s, mut rng) = (Stream::cpu(), Rng::new(18));
    let sizes = [17, 1, 40];
    let g0: Vec<Vec<f32>> = sizes.iter().map(|&n| rng.normal_vec(n, 1.0)).collect();
    let bufs = || g0.iter().map(|g| buf(&s, g)).collect::<Vec<_>>();

    let ss = grad_clip::host::grad_sum_squares(&g0);
    let b = bufs();
    let views: Vec<_> = b.iter().map(|b| b.view()).collect();
    let dv = ops::grad_sum_squares(&s, &views).unwrap();
    assert_eq!(dv.to_bits(), ss.to_bits(), "sum of squares");

    let check = |what: &str, b: &[DeviceBuffer<f32>], want: &[Vec<f32>]| {
        for (i, (b, w)) in b.iter().zip(want).enumerate() {
            assert_same(&format!("{what} [{i}]"), &host(&s, b), w, &g0[i]);
        }
    };

    let mut g = g0.clone();
    grad_clip::host::scale_grads(&mut g, 0.25);
    let mut b = bufs();
    let mut views: Vec<_> = b.iter_mut().map(|b| b.view_mut()).collect();
    ops::scale_grads(&s, &mut views, 0.25).unwrap();
    check("scale_grads", &b, &g);

    // max_norm well below the norm (~7.6), so both calls clip.
    let mut g = g0.clone();
    let norm = grad_clip::host::clip_with_sum_squares(&mut g, ss * 4.0, 1.0).unwrap();
    let mut b = bufs();
    let mut views: Vec<_> = b.iter_mut().map(|b| b.view_mut()).collect();
    let dv = ops::clip_with_sum_squares(&s, &mut views, ss * 4.0, 1.0).unwrap();
    assert_eq!(dv.to_bits(), norm.to_bits(), "clip_with_sum_squares norm");
    check("clip_with_sum_squares", &b, &g);

    let mut g = g0.clone();
    let norm = grad_clip::host::clip_grad_norm(&mut g, 1.0).unwrap();
    let mut b = bufs();
    let mut views: Vec<_> = b.iter_mut().map(|b| b.view_mut()).collect();
    let dv = ops::clip_grad_norm(&s, &mut views, 1.0).unwrap();
    assert_eq!(dv.to_bits(), norm.to_bits(), "clip_grad_norm norm");
    check("clip_grad_norm", &b, &g);
}

/// Bad input through the device level is the slice level's typed error, not a panic.
#[test]
fn device_level_errors_are_typed() {
    let (s, mut rng) = (Stream::cpu(), Rng::new(19));
    let x = buf(&s, &rng.normal_vec(12, 1.0));
    let mut y = buf(&s, &rng.normal_vec(11, 1.0));
    let e = ops::gelu_forward(&s, &mut y.view_mut(), &x.view()).unwrap_err();
    assert!(
        matches!(
            e,
            KernelError::Shape {
                op: "gelu_forward",
                ..
            }
        ),
        "{e}"
    );

    let w = buf(&s, &rng.normal_vec(4 * 3, 1.0));
    let mut out = buf(&s, &rng.normal_vec(2 * 3, 1.0));
    let e = ops::embedding_forward(&s, &mut out.view_mut(), &[1, 4], &w.view(), 3).unwrap_err();
    assert!(
        matches!(
            e,
            KernelError::InvalidArgument {
                op: "embedding_forward",
                ..
            }
        ),
        "{e}"
    );

    // h shorter than labels x D: rejected before any chunk is produced.
    let (h, wv) = (buf(&s, &[0.0f32; 5]), buf(&s, &[0.0f32; 6]));
    let nograd = cross_entropy::LmHeadGrads { dh: None, dw: None };
    let e = ops::cross_entropy_lm_head(
        &s,
        &h.view(),
        &wv.view(),
        &[0, 1],
        3,
        2,
        1,
        LossNorm::Mean,
        nograd,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            KernelError::Shape {
                op: "cross_entropy_chunked",
                ..
            }
        ),
        "{e}"
    );
}
