//! NPU operands: the dispatch rules (`backend` / `backend_on` on device lists) and the
//! pending NPU entry points of every op.

use super::buf;
use cannon_kernels::cross_entropy::LossNorm;
use cannon_kernels::device::{backend, backend_on, npu_pending, Backend};
use cannon_kernels::gemm::{Dims, Trans};
use cannon_kernels::linear::LinearDims;
use cannon_kernels::patch_embed::PatchGeom;
use cannon_kernels::rope::RopeTable;
use cannon_kernels::{
    adamw, cast, cross_entropy, embedding, gelu, gemm, grad_clip, linear, patch_embed, rmsnorm,
    rope, swiglu, KernelError,
};
use cannon_runtime::{Device, Stream};
use half::bf16;

#[test]
fn backend_follows_the_stream_device() {
    let cpu = Stream::cpu();
    assert_eq!(backend("op", &cpu, &[]).unwrap(), Backend::Cpu);
    assert_eq!(
        backend("op", &cpu, &[Device::Cpu; 3]).unwrap(),
        Backend::Cpu
    );
    let npu = [Device::Npu(2); 4];
    assert_eq!(
        backend_on("op", Device::Npu(2), &npu).unwrap(),
        Backend::Npu(2)
    );
}

#[track_caller]
fn assert_mismatch(e: KernelError, op: &str, expected: Device, found: Device) {
    let msg = e.to_string();
    match e {
        KernelError::Runtime(cannon_runtime::Error::DeviceMismatch {
            what,
            expected: ex,
            found: fo,
        }) => {
            assert_eq!((what, ex, fo), (op, expected, found));
        }
        other => panic!("expected a device mismatch, got {other:?}"),
    }
    for part in [op.to_string(), expected.to_string(), found.to_string()] {
        assert!(msg.contains(&part), "{msg:?} does not name {part}");
    }
}

#[test]
fn mixed_devices_are_a_typed_error_naming_op_and_devices() {
    let cpu = Stream::cpu();
    let e = backend("rmsnorm_forward", &cpu, &[Device::Cpu, Device::Npu(0)]).unwrap_err();
    assert_mismatch(e, "rmsnorm_forward", Device::Cpu, Device::Npu(0));

    let ops = [Device::Npu(0), Device::Cpu, Device::Npu(0)];
    let e = backend_on("linear_forward", Device::Npu(0), &ops).unwrap_err();
    assert_mismatch(e, "linear_forward", Device::Npu(0), Device::Cpu);

    let e = backend_on("gemm_f32", Device::Npu(0), &[Device::Npu(1)]).unwrap_err();
    assert_mismatch(e, "gemm_f32", Device::Npu(0), Device::Npu(1));
}

/// The error an NPU entry must return until its body lands, on this build.
#[track_caller]
fn assert_pending<T: std::fmt::Debug>(
    r: cannon_kernels::Result<T>,
    op: &str,
    ordinal: u32,
    aclnn: &str,
) {
    let device = Device::Npu(ordinal).to_string();
    match r {
        Err(KernelError::NotCompiled { op: o, device: d }) if !cfg!(feature = "npu") => {
            assert_eq!((o, d.as_str()), (op, device.as_str()));
        }
        Err(KernelError::Unsupported {
            op: o,
            device: d,
            reason,
        }) if cfg!(feature = "npu") => {
            assert_eq!((o, d.as_str()), (op, device.as_str()));
            assert!(
                reason.contains(aclnn),
                "{op}: {reason:?} does not name {aclnn}"
            );
        }
        other => panic!("{op}: expected the pending-NPU error of this build, got {other:?}"),
    }
}

#[test]
fn npu_pending_depends_on_the_build() {
    let e = npu_pending("swiglu_forward", 3, "aclnnSwiGlu");
    let msg = e.to_string();
    assert!(
        msg.contains("swiglu_forward") && msg.contains("npu:3"),
        "{msg}"
    );
    assert_pending::<()>(Err(e), "swiglu_forward", 3, "aclnnSwiGlu");
}

/// Every op's NPU entry point returns the pending error naming the op and its aclnn op (the
/// entries ignore their buffers until the bodies land, so host buffers stand in).
#[test]
fn every_npu_entry_is_pending() {
    let s = Stream::cpu();
    let f = |n: usize| buf(&s, &vec![0.0f32; n]);
    let h = |n: usize| buf(&s, &vec![bf16::ZERO; n]);
    let (a, mut b, mut c, mut d) = (f(64), f(64), f(64), f(64));
    let (a16, mut b16) = (h(64), h(64));
    let (av, a16v) = (a.view(), a16.view());

    assert_pending(
        rmsnorm::npu::forward(
            0,
            &s,
            &mut b.view_mut(),
            &mut c.view_mut(),
            &av,
            &av,
            8,
            1e-5,
        ),
        "rmsnorm_forward",
        0,
        "aclnnRmsNorm",
    );
    let (mut bv, mut cv) = (b.view_mut(), c.view_mut());
    let r = rmsnorm::npu::backward(0, &s, &mut bv, &mut cv, &av, &av, &av, &av, 8);
    assert_pending(r, "rmsnorm_backward", 0, "aclnnRmsNormGrad");

    let r = swiglu::npu::forward(0, &s, &mut b.view_mut(), &av, &av);
    assert_pending(r, "swiglu_forward", 0, "aclnnSwiGlu");
    let r = swiglu::npu::backward(0, &s, &mut b.view_mut(), &mut c.view_mut(), &av, &av, &av);
    assert_pending(r, "swiglu_backward", 0, "aclnnSwiGluGrad");

    let r = gelu::npu::forward(0, &s, &mut b.view_mut(), &av);
    assert_pending(r, "gelu_forward", 0, "aclnnGeluV2");
    let r = gelu::npu::backward(0, &s, &mut b.view_mut(), &av, &av);
    assert_pending(r, "gelu_backward", 0, "aclnnGeluBackwardV2");

    let r = cast::npu::f32_to_bf16(0, &s, &av, &mut b16.view_mut());
    assert_pending(r, "cast_f32_to_bf16", 0, "aclnnCast");
    let r = cast::npu::bf16_to_f32(0, &s, &a16v, &mut b.view_mut());
    assert_pending(r, "cast_bf16_to_f32", 0, "aclnnCast");
    let r = cast::npu::convert(0, &s, &a16v, &mut b.view_mut());
    assert_pending(r, "cast", 0, "aclnnCast");

    let hp = adamw::AdamW::default();
    let r = adamw::npu::step(
        0,
        &s,
        &mut b.view_mut(),
        &av,
        &mut c.view_mut(),
        &mut d.view_mut(),
        1,
        &hp,
    );
    assert_pending(r, "adamw_step", 0, "aclnnApplyAdamWV2");

    let r = embedding::npu::forward(0, &s, &mut b.view_mut(), &[0, 1], &av, 8);
    assert_pending(r, "embedding_forward", 0, "aclnnEmbedding");
    let r = embedding::npu::backward(0, &s, &mut b.view_mut(), &av, &[0, 1], 8);
    assert_pending(r, "embedding_backward", 0, "aclnnEmbeddingDenseBackward");

    let dims = Dims { m: 2, n: 2, k: 2 };
    let (n_, cv) = (Trans::N, &mut c.view_mut());
    let r = gemm::npu::f32(0, &s, n_, n_, dims, 1.0, &av, 2, &av, 2, 0.0, cv, 2);
    assert_pending(r, "gemm_f32", 0, "aclnnMatmul");
    let r = gemm::npu::bf16(0, &s, n_, n_, dims, 1.0, &a16v, 2, &av, 2, 0.0, cv, 2);
    assert_pending(r, "gemm_bf16", 0, "aclnnMatmul");

    let r = grad_clip::npu::grad_sum_squares(0, &s, &[av]);
    assert_pending(r, "grad_sum_squares", 0, "aclnnMatmul");
    let r = grad_clip::npu::scale_grads(0, &s, &mut [b.view_mut()], 0.5);
    assert_pending(r, "scale_grads", 0, "aclnnInplaceMuls");

    let ld = LinearDims {
        t: 2,
        d_in: 2,
        d_out: 2,
    };
    let none = || linear::device::Grads {
        dx: None,
        dw: None,
        db: None,
    };
    let r = linear::npu::forward(0, &s, &mut b.view_mut(), &av, &av, None, ld);
    assert_pending(r, "linear_forward", 0, "aclnnMatmul");
    let r = linear::npu::backward(0, &s, none(), &av, &av, &av, ld);
    assert_pending(r, "linear_backward", 0, "aclnnMatmul");
    let r = linear::npu::forward_bf16(0, &s, &mut b.view_mut(), &a16v, &a16v, None, ld);
    assert_pending(r, "linear_forward_bf16", 0, "aclnnMatmul");
    let r = linear::npu::forward_bf16_to_bf16(0, &s, &mut b16.view_mut(), &a16v, &av, None, ld);
    assert_pending(r, "linear_forward_bf16", 0, "aclnnCast");
    let r = linear::npu::backward_bf16(0, &s, none(), &a16v, &av, &a16v, ld);
    assert_pending(r, "linear_backward_bf16", 0, "aclnnMatmul");

    let g = PatchGeom {
        channels: 1,
        height: 2,
        width: 2,
        h: 2,
        w: 2,
        patch: 2,
    };
    let none = || patch_embed::device::Grads {
        dweight: None,
        dpixels: None,
    };
    let r = patch_embed::npu::forward(0, &s, &mut b.view_mut(), &av, &av, g, 2);
    assert_pending(r, "patch_embed_forward", 0, "aclnnMatmul");
    let r = patch_embed::npu::backward(0, &s, none(), &av, &av, &av, g, 2);
    assert_pending(r, "patch_embed_backward", 0, "aclnnInplaceAdd");
    let r = patch_embed::npu::forward_bf16(0, &s, &mut b.view_mut(), &a16v, &av, g, 2);
    assert_pending(r, "patch_embed_forward_bf16", 0, "aclnnMatmul");
    let r = patch_embed::npu::backward_bf16(0, &s, none(), &av, &a16v, &av, g, 2);
    assert_pending(r, "patch_embed_backward_bf16", 0, "aclnnMatmul");

    let table = RopeTable::text(8, 1e4, 4).unwrap();
    let r = rope::npu::forward(0, &s, &mut b.view_mut(), 1, &table, &[0]);
    assert_pending(r, "rope_forward", 0, "aclnnRotaryPositionEmbedding");
    let r = rope::npu::backward(0, &s, &mut b16.view_mut(), 1, &table, &[0]);
    assert_pending(r, "rope_backward", 0, "aclnnRotaryPositionEmbeddingGrad");

    let norm = LossNorm::Mean;
    let r = cross_entropy::npu::full(0, &s, &av, &[0], 64, Some(&mut b.view_mut()), norm);
    assert_pending(r, "cross_entropy", 0, "aclnnCrossEntropyLoss");
    let r = cross_entropy::npu::in_place(0, &s, &mut b.view_mut(), &[0], 64, norm);
    assert_pending(r, "cross_entropy_in_place", 0, "aclnnCrossEntropyLossGrad");
    let grads = cross_entropy::device::LmHeadGrads { dh: None, dw: None };
    let r = cross_entropy::npu::chunked_lm_head(0, &s, &av, &av, &[0], 8, 8, 1, norm, grads);
    assert_pending(r, "cross_entropy_chunked", 0, "aclnnCrossEntropyLoss");
}
