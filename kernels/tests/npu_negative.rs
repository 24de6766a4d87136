//! Misuses of aclnn that the host emulation of CANN must turn into typed errors (never a crash
//! or a wrong answer), driven through the kernels' aclnn plumbing
//! (`cannon_kernels::backend::aclnn`): a wrong layout string, lengths that are not cumulative,
//! a host pointer given as device memory, an executor launched twice. (A misaligned view
//! through `ops::*` is in npu_ops.rs.) Each error carries the C function and the emulator's
//! `aclGetRecentErrMsg` text.

#![cfg(feature = "npu")]

use cannon_kernels::backend::aclnn::{check, run, AclIntArray, AclScalar, AclTensor};
use cannon_kernels::KernelError;
use cannon_runtime::{Device, DeviceBuffer, Stream};
use cannon_sys::aclnn as sys;
use std::ffi::c_void;

/// One test at a time on the device (blocks return to the caching allocator while work on
/// them is queued, which is safe for reuse on the same stream only; see npu_ops.rs).
static NPU: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The device for one test, or None (with a note) on an installed CANN: these checks read
/// the emulator's messages.
fn npu() -> Option<(std::sync::MutexGuard<'static, ()>, Stream)> {
    match cannon_sys::emulator::select_for_tests() {
        Ok(c) if c.is_emulator() => {}
        Ok(_) => {
            eprintln!("skipped on the installed CANN: the test reads the emulator's messages");
            return None;
        }
        Err(e) => panic!("{e}"),
    }
    let g = NPU.lock().unwrap_or_else(|p| p.into_inner());
    Some((g, Stream::new(Device::Npu(1)).unwrap()))
}

fn aclnn_err(e: KernelError) -> (&'static str, i32, String) {
    match e {
        KernelError::Aclnn {
            call,
            status,
            message,
            ..
        } => (call, status, message),
        other => panic!("expected an aclnn error, got {other}"),
    }
}

/// A `[T, N, D]` buffer and its descriptor.
fn tnd(s: &Stream, t: usize, n: usize, d: usize) -> (DeviceBuffer<f32>, AclTensor) {
    let mut b = DeviceBuffer::<f32>::alloc_zeros(s, t * n * d).unwrap();
    let desc = AclTensor::from_buffer("test", &mut b, &[t, n, d]).unwrap();
    (b, desc)
}

/// Phase 1 of the varlen forward with the given layout and sequence ends (full attention).
fn fa_forward(s: &Stream, layout: &str, ends: &[i64]) -> Result<(), KernelError> {
    let (t, n, d) = (8, 2, 16);
    let (_q, qt) = tnd(s, t, n, d);
    let (_k, kt) = tnd(s, t, n, d);
    let (_v, vt) = tnd(s, t, n, d);
    let (_o, ot) = tnd(s, t, n, d);
    let (_m, mt) = tnd(s, t, n, 8);
    let (_s, st) = tnd(s, t, n, 8);
    let seq = AclIntArray::new("test", ends).unwrap();
    let mut l = format!("{layout}\0").into_bytes();
    let null = std::ptr::null();
    run(
        "attention_forward",
        "aclnnFlashAttentionVarLenScore",
        "aclnnFlashAttentionVarLenScoreGetWorkspaceSize",
        s,
        // SAFETY: live descriptors, a NUL-terminated layout and the plumbing's out-pointers.
        |ws, ex| unsafe {
            sys::aclnnFlashAttentionVarLenScoreGetWorkspaceSize(
                qt.raw(),
                kt.raw(),
                vt.raw(),
                null,
                null,
                null,
                null,
                std::ptr::null(),
                seq.raw(),
                seq.raw(),
                0.25,
                1.0,
                i32::MAX as i64,
                i32::MAX as i64,
                n as i64,
                l.as_mut_ptr() as *mut std::ffi::c_char,
                0,
                0,
                mt.raw(),
                st.raw(),
                null,
                ot.raw(),
                ws,
                ex,
            )
        },
        sys::aclnnFlashAttentionVarLenScore,
    )
}

#[test]
fn the_varlen_call_itself_runs() {
    let Some((_g, s)) = npu() else { return };
    fa_forward(&s, "TND", &[3, 8]).unwrap();
    s.synchronize().unwrap();
}

#[test]
fn a_wrong_layout_string_is_a_typed_error() {
    let Some((_g, s)) = npu() else { return };
    for bad in ["BSND", "tnd", "TND "] {
        let (call, status, m) = aclnn_err(fa_forward(&s, bad, &[3, 8]).unwrap_err());
        assert_eq!(call, "aclnnFlashAttentionVarLenScoreGetWorkspaceSize");
        assert_eq!(status, 161002, "ACLNN_ERR_PARAM_INVALID");
        assert!(m.contains("inputLayout") && m.contains("TND"), "{m}");
    }
}

#[test]
fn lengths_instead_of_cumulative_ends_are_a_typed_error() {
    let Some((_g, s)) = npu() else { return };
    // Lengths 3 and 5 given as such: not cumulative... [3, 5] is increasing but ends at 5,
    // not T = 8; [5, 3] decreases.
    let (_, _, m) = aclnn_err(fa_forward(&s, "TND", &[5, 3]).unwrap_err());
    assert!(m.contains("not cumulative"), "{m}");
    let (_, _, m) = aclnn_err(fa_forward(&s, "TND", &[3, 5]).unwrap_err());
    assert!(m.contains("ends at 5") && m.contains("T = 8"), "{m}");
    // A leading 0 is an empty first sequence, valid.
    fa_forward(&s, "TND", &[0, 3, 8]).unwrap();
    s.synchronize().unwrap();
}

#[test]
fn a_host_pointer_as_device_memory_is_a_typed_error() {
    let Some((_g, _s)) = npu() else { return };
    let host = vec![0f32; 64];
    // SAFETY: deliberately not device memory: the emulator must refuse it.
    let e = unsafe {
        AclTensor::strided::<f32>(
            "test",
            host.as_ptr() as *mut c_void,
            &[8, 8],
            &[8, 1],
            &[8, 8],
        )
    }
    .err()
    .unwrap();
    let (call, _, m) = aclnn_err(e);
    assert_eq!(call, "aclCreateTensor");
    assert!(m.contains("not device memory"), "{m}");
}

#[test]
fn an_executor_launched_twice_is_a_typed_error() {
    let Some((_g, s)) = npu() else { return };
    let mut a = DeviceBuffer::<f32>::clone_htod(&s, &[1.0; 8]).unwrap();
    let mut b = DeviceBuffer::<f32>::clone_htod(&s, &[2.0; 8]).unwrap();
    let at = AclTensor::from_buffer("test", &mut a, &[8]).unwrap();
    let bt = AclTensor::from_buffer("test", &mut b, &[8]).unwrap();
    let alpha = AclScalar::f32("test", 1.0).unwrap();
    let mut ws = 0u64;
    let mut ex: *mut sys::aclOpExecutor = std::ptr::null_mut();
    // SAFETY: live descriptors and out-pointers.
    let r = unsafe {
        sys::aclnnInplaceAddGetWorkspaceSize(at.raw(), bt.raw(), alpha.raw(), &mut ws, &mut ex)
    };
    check("test", "aclnnInplaceAddGetWorkspaceSize", r).unwrap();
    assert_eq!(ws, 0);
    let raw = s.acl_stream().unwrap().raw();
    // SAFETY: a fresh executor, no workspace asked.
    let r = unsafe { sys::aclnnInplaceAdd(std::ptr::null_mut(), 0, ex, raw) };
    check("test", "aclnnInplaceAdd", r).unwrap();
    // SAFETY: the same executor again: the C call only looks the handle up.
    let r = unsafe { sys::aclnnInplaceAdd(std::ptr::null_mut(), 0, ex, raw) };
    let (call, status, m) = aclnn_err(check("test", "aclnnInplaceAdd", r).unwrap_err());
    assert_eq!((call, status), ("aclnnInplaceAdd", 161002));
    assert!(m.contains("already launched"), "{m}");
    // The first launch ran, once.
    s.synchronize().unwrap();
    assert_eq!(a.clone_dtoh(&s).unwrap(), vec![3.0; 8]);
}

#[test]
fn a_workspace_smaller_than_asked_is_a_typed_error() {
    let Some((_g, s)) = npu() else { return };
    let mut a = DeviceBuffer::<f32>::clone_htod(&s, &[1.0; 64]).unwrap();
    let mut o = DeviceBuffer::<f32>::alloc(&s, 64).unwrap();
    let (at, ot) = (
        AclTensor::from_buffer("test", &mut a, &[8, 8]).unwrap(),
        AclTensor::from_buffer("test", &mut o, &[8, 8]).unwrap(),
    );
    let mut ws = 0u64;
    let mut ex: *mut sys::aclOpExecutor = std::ptr::null_mut();
    // SAFETY: live descriptors and out-pointers.
    let r =
        unsafe { sys::aclnnMmGetWorkspaceSize(at.raw(), at.raw(), ot.raw(), 0, &mut ws, &mut ex) };
    check("test", "aclnnMmGetWorkspaceSize", r).unwrap();
    assert!(ws > 0, "the emulated Mm asks for a workspace");
    let raw = s.acl_stream().unwrap().raw();
    // SAFETY: the handle is only looked up.
    let r = unsafe { sys::aclnnMm(std::ptr::null_mut(), 0, ex, raw) };
    let (_, _, m) = aclnn_err(check("test", "aclnnMm", r).unwrap_err());
    assert!(m.contains("less than the"), "{m}");
    // A host buffer as workspace.
    let mut host = vec![0u8; ws as usize];
    // SAFETY: the handle is only looked up; the workspace pointer is what is checked.
    let r = unsafe { sys::aclnnMm(host.as_mut_ptr() as *mut c_void, ws, ex, raw) };
    let (_, _, m) = aclnn_err(check("test", "aclnnMm", r).unwrap_err());
    assert!(m.contains("not device memory"), "{m}");
    // The executor was not consumed by the failed launches: a proper one runs it.
    let mut w = DeviceBuffer::<u8>::alloc(&s, ws as usize).unwrap();
    // SAFETY: a device workspace of the size asked.
    let r = unsafe { sys::aclnnMm(w.as_raw_mut_ptr() as *mut c_void, ws, ex, raw) };
    check("test", "aclnnMm", r).unwrap();
    s.synchronize().unwrap();
    assert_eq!(o.clone_dtoh(&s).unwrap(), vec![8.0; 64]);
}
