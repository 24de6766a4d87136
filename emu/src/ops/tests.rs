//! Op handlers called directly through their C entry points on emulated device memory
//! (allocated with `mem::alloc`, filled through `mem::resolve`), checked against values
//! computed here independently.

use crate::nnopbase::*;
use cannon_sys::acl::*;
use cannon_sys::aclnn::{aclOpExecutor, aclTensor};
use std::ffi::c_void;

/// A device allocation holding `vals`, and an ND contiguous aclTensor over it.
pub(crate) struct Dev {
    pub addr: usize,
    pub t: *mut aclTensor,
    pub len: usize,
}

impl Dev {
    pub fn new<T: bytemuck::Pod>(vals: &[T], dims: &[i64], dtype: aclDataType) -> Dev {
        let bytes = std::mem::size_of_val(vals).max(1);
        let addr = crate::mem::alloc(0, bytes).unwrap();
        let p = crate::mem::resolve(addr, bytes).unwrap();
        // SAFETY: p is the host backing of `bytes` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                vals.as_ptr() as *const u8,
                p,
                std::mem::size_of_val(vals),
            )
        };
        let t = tensor_at(addr, dims, dtype);
        Dev {
            addr,
            t,
            len: vals.len(),
        }
    }

    pub fn f32(vals: &[f32], dims: &[i64]) -> Dev {
        Dev::new(vals, dims, ACL_FLOAT)
    }

    pub fn get<T: bytemuck::Pod>(&self) -> Vec<T> {
        let bytes = self.len * std::mem::size_of::<T>();
        let p = crate::mem::resolve(self.addr, bytes).unwrap();
        // SAFETY: p backs `bytes` bytes; the stream was synchronised by the caller.
        let s = unsafe { std::slice::from_raw_parts(p, bytes) };
        let mut v = vec![T::zeroed(); self.len];
        bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(s);
        v
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        // SAFETY: t came from aclCreateTensor.
        unsafe { aclDestroyTensor(self.t) };
        crate::mem::free(self.addr).unwrap();
    }
}

/// A contiguous ND tensor over `addr`.
pub(crate) fn tensor_at(addr: usize, dims: &[i64], dtype: aclDataType) -> *mut aclTensor {
    let mut strides = vec![1i64; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1];
    }
    // SAFETY: arrays of dims.len() values.
    let t = unsafe {
        aclCreateTensor(
            dims.as_ptr(),
            dims.len() as u64,
            dtype,
            strides.as_ptr(),
            0,
            ACL_FORMAT_ND,
            dims.as_ptr(),
            dims.len() as u64,
            addr as *mut c_void,
        )
    };
    assert!(!t.is_null(), "{:?}", crate::error::take_recent());
    t
}

/// Runs phase 2 of an op on the thread's default stream of device 0 with a fresh workspace
/// of the size asked, synchronises, and returns the status of the stream.
pub(crate) fn launch(
    ws: u64,
    ex: *mut aclOpExecutor,
    phase2: unsafe extern "C" fn(
        *mut c_void,
        u64,
        *mut aclOpExecutor,
        cannon_sys::acl::aclrtStream,
    ) -> i32,
) -> crate::error::EmuResult<()> {
    crate::device::set_current(0);
    let w = if ws > 0 {
        crate::mem::alloc(0, ws as usize).unwrap()
    } else {
        0
    };
    // SAFETY: a live executor and workspace; null stream = the default stream.
    let st = unsafe { phase2(w as *mut c_void, ws, ex, std::ptr::null_mut()) };
    assert_eq!(st, 0, "{:?}", crate::error::take_recent());
    let s = crate::device::lookup(0).unwrap();
    let r = s.synchronize(None).map(|_| ());
    if w != 0 {
        crate::mem::free(w).unwrap();
    }
    r
}

/// Phase 1 of an op (`f` calls its GetWorkspaceSize with the test's handles and the given
/// out-pointers): asserts success and returns the workspace size and executor.
pub(crate) fn phase1_ok(
    f: impl FnOnce(*mut u64, *mut *mut aclOpExecutor) -> i32,
) -> (u64, *mut aclOpExecutor) {
    let mut ws = 0u64;
    let mut ex: *mut aclOpExecutor = std::ptr::null_mut();
    let st = f(&mut ws, &mut ex);
    assert_eq!(st, 0, "{:?}", crate::error::take_recent());
    (ws, ex)
}

/// Phase 1 expected to fail: asserts no executor was made and returns the recorded message.
pub(crate) fn phase1_err(f: impl FnOnce(*mut u64, *mut *mut aclOpExecutor) -> i32) -> String {
    let mut ws = 0u64;
    let mut ex: *mut aclOpExecutor = std::ptr::null_mut();
    let st = f(&mut ws, &mut ex);
    assert_ne!(st, 0);
    assert!(ex.is_null());
    crate::error::take_recent().unwrap()
}

mod ring_update;

mod elementwise {
    use super::*;
    use crate::ops::elementwise::*;

    fn alpha(v: f32) -> *mut cannon_sys::aclnn::aclScalar {
        let mut v = v;
        // SAFETY: a live f32.
        unsafe { aclCreateScalar(&mut v as *mut f32 as *mut c_void, ACL_FLOAT) }
    }

    #[test]
    fn add_with_alpha_and_broadcast() {
        let a = Dev::f32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
        let b = Dev::f32(&[10.0, 20.0, 30.0], &[3]);
        let out = Dev::f32(&[0.0; 6], &[2, 3]);
        let al = alpha(0.5);
        let (ws, ex) = phase1_ok(|w, e| {
            // SAFETY: live handles from this test and valid out-pointers.
            unsafe { aclnnAddGetWorkspaceSize(a.t, b.t, al, out.t, w, e) }
        });
        launch(ws, ex, aclnnAdd).unwrap();
        let want: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]
            .iter()
            .enumerate()
            .map(|(i, x)| x + 0.5 * [10.0, 20.0, 30.0][i % 3])
            .collect();
        assert_eq!(out.get::<f32>(), want);
        // SAFETY: a live scalar.
        unsafe { aclDestroyScalar(al) };
    }

    #[test]
    fn inplace_mul_and_cast_to_bf16() {
        let a = Dev::f32(&[1.5, -2.0, 3.25, 1.0 / 3.0], &[4]);
        let b = Dev::f32(&[2.0, 2.0, 2.0, 3.0], &[4]);
        let (ws, ex) = phase1_ok(|w, e| {
            // SAFETY: live handles from this test and valid out-pointers.
            unsafe { aclnnInplaceMulGetWorkspaceSize(a.t, b.t, w, e) }
        });
        launch(ws, ex, aclnnInplaceMul).unwrap();
        assert_eq!(a.get::<f32>(), vec![3.0, -4.0, 6.5, 1.0]);
        let h = Dev::new(&[0u16; 4], &[4], ACL_BF16);
        let (ws, ex) = phase1_ok(|w, e| {
            // SAFETY: live handles from this test and valid out-pointers.
            unsafe { aclnnCastGetWorkspaceSize(a.t, ACL_BF16, h.t, w, e) }
        });
        launch(ws, ex, aclnnCast).unwrap();
        let want: Vec<u16> = [3.0f32, -4.0, 6.5, 1.0]
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_bits())
            .collect();
        assert_eq!(h.get::<u16>(), want);
    }

    #[test]
    fn shape_dtype_and_null_errors_name_the_argument() {
        let a = Dev::f32(&[1.0; 4], &[4]);
        let b = Dev::f32(&[1.0; 3], &[3]);
        let out = Dev::f32(&[0.0; 4], &[4]);
        let m = phase1_err(|w, e| {
            // SAFETY: live handles from this test and valid out-pointers.
            unsafe { aclnnMulGetWorkspaceSize(a.t, b.t, out.t, w, e) }
        });
        assert!(m.contains("do not broadcast"), "{m}");
        let m = phase1_err(|w, e| {
            // SAFETY: live handles from this test and valid out-pointers.
            unsafe { aclnnMulGetWorkspaceSize(a.t, std::ptr::null(), out.t, w, e) }
        });
        assert!(m.contains("other is null"), "{m}");
        let i = Dev::new(&[0i64; 4], &[4], ACL_INT64);
        let m = phase1_err(|w, e| {
            // SAFETY: live handles from this test and valid out-pointers.
            unsafe { aclnnMulGetWorkspaceSize(a.t, i.t, out.t, w, e) }
        });
        assert!(m.contains("INT64"), "{m}");
    }

    #[test]
    fn an_executor_runs_once_unless_repeatable() {
        let a = Dev::f32(&[1.0, 2.0], &[2]);
        let b = Dev::f32(&[1.0, 1.0], &[2]);
        let al = alpha(1.0);
        let (ws, ex) = phase1_ok(|w, e| {
            // SAFETY: live handles from this test and valid out-pointers.
            unsafe { aclnnInplaceAddGetWorkspaceSize(a.t, b.t, al, w, e) }
        });
        launch(ws, ex, aclnnInplaceAdd).unwrap();
        // SAFETY: the handle is only looked up.
        let st = unsafe { aclnnInplaceAdd(std::ptr::null_mut(), 0, ex, std::ptr::null_mut()) };
        assert_eq!(st, PARAM_INVALID);
        let m = crate::error::take_recent().unwrap();
        assert!(m.contains("already launched"), "{m}");
        assert_eq!(a.get::<f32>(), vec![2.0, 3.0]);

        let (ws, ex) = phase1_ok(|w, e| {
            // SAFETY: live handles from this test and valid out-pointers.
            unsafe { aclnnInplaceAddGetWorkspaceSize(a.t, b.t, al, w, e) }
        });
        // SAFETY: a live executor.
        assert_eq!(unsafe { executor::aclSetAclOpExecutorRepeatable(ex) }, 0);
        launch(ws, ex, aclnnInplaceAdd).unwrap();
        launch(ws, ex, aclnnInplaceAdd).unwrap();
        assert_eq!(a.get::<f32>(), vec![4.0, 5.0]);
        // SAFETY: a live repeatable executor, destroyed once.
        assert_eq!(unsafe { executor::aclDestroyAclOpExecutor(ex) }, 0);
        // SAFETY: a live scalar.
        unsafe { aclDestroyScalar(al) };
    }
}

/// The ops that read and write device memory in place (matmul, element-wise, embedding
/// backward) against values computed here, including the aliasings that must take the
/// copying path instead.
mod in_place {
    use super::*;
    use crate::ops::elementwise::*;
    use crate::ops::embedding::*;
    use crate::ops::matmul::*;

    /// A view over `addr` with explicit strides and element offset, over a storage of `storage`.
    fn view(
        addr: usize,
        dims: &[i64],
        strides: &[i64],
        offset: i64,
        storage: &[i64],
    ) -> *mut aclTensor {
        // SAFETY: arrays of the stated lengths.
        let t = unsafe {
            aclCreateTensor(
                dims.as_ptr(),
                dims.len() as u64,
                ACL_FLOAT,
                strides.as_ptr(),
                offset,
                ACL_FORMAT_ND,
                storage.as_ptr(),
                storage.len() as u64,
                addr as *mut c_void,
            )
        };
        assert!(!t.is_null(), "{:?}", crate::error::take_recent());
        t
    }

    fn one() -> *mut cannon_sys::aclnn::aclScalar {
        let mut v = 1.0f32;
        // SAFETY: a live f32.
        unsafe { aclCreateScalar(&mut v as *mut f32 as *mut c_void, ACL_FLOAT) }
    }

    #[test]
    fn matmul_reads_a_transposed_weight_in_place() {
        // x [2, 3] @ w^T, w stored [4, 3] and passed as the view [3, 4] of strides [1, 3].
        let xv = [1.0f32, -2.0, 0.5, 3.0, 0.25, -1.0];
        let wv: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 2.0).collect();
        let x = Dev::f32(&xv, &[2, 3]);
        let w = Dev::f32(&wv, &[4, 3]);
        let wt = view(w.addr, &[3, 4], &[1, 3], 0, &[4, 3]);
        let out = Dev::f32(&[f32::NAN; 8], &[2, 4]);
        let (ws, ex) = phase1_ok(|ws, e| {
            // SAFETY: live handles from this test and valid out-pointers.
            unsafe { aclnnMatmulGetWorkspaceSize(x.t, wt, out.t, 0, ws, e) }
        });
        launch(ws, ex, aclnnMatmul).unwrap();
        let want: Vec<f32> = (0..2)
            .flat_map(|i| (0..4).map(move |j| (i, j)))
            .map(|(i, j)| (0..3).map(|p| xv[i * 3 + p] * wv[j * 3 + p]).sum())
            .collect();
        assert_eq!(out.get::<f32>(), want);
        // SAFETY: made above, destroyed once.
        unsafe { aclDestroyTensor(wt) };
    }

    #[test]
    fn add_into_either_operand_or_an_overlapping_view() {
        let av = [1.0f32, 2.0, 3.0, 4.0, 5.0];
        let bv = [10.0f32, 20.0, 30.0, 40.0, 50.0];
        let sum: Vec<f32> = av.iter().zip(&bv).map(|(a, b)| a + b).collect();
        let al = one();
        // out is `other` itself.
        let a = Dev::f32(&av, &[5]);
        let b = Dev::f32(&bv, &[5]);
        let (ws, ex) = phase1_ok(|w, e| {
            // SAFETY: live handles from this test and valid out-pointers.
            unsafe { aclnnAddGetWorkspaceSize(a.t, b.t, al, b.t, w, e) }
        });
        launch(ws, ex, aclnnAdd).unwrap();
        assert_eq!(b.get::<f32>(), sum);
        // out is `self` shifted by 8 elements (32 bytes, the ops' alignment): it shares bytes
        // without being it, and every input element is read before any output is written,
        // as on hardware.
        let xv: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let yv: Vec<f32> = (0..16).map(|i| 100.0 * i as f32).collect();
        let mut held = xv.clone();
        held.extend([0.0; 8]);
        let a = Dev::f32(&held, &[24]);
        let b = Dev::f32(&yv, &[16]);
        let (self4, out4) = (
            view(a.addr, &[16], &[1], 0, &[24]),
            view(a.addr, &[16], &[1], 8, &[24]),
        );
        let (ws, ex) = phase1_ok(|w, e| {
            // SAFETY: live handles from this test and valid out-pointers.
            unsafe { aclnnAddGetWorkspaceSize(self4, b.t, al, out4, w, e) }
        });
        launch(ws, ex, aclnnAdd).unwrap();
        let mut want = xv[..8].to_vec();
        want.extend(xv.iter().zip(&yv).map(|(x, y)| x + y));
        assert_eq!(a.get::<f32>(), want);
        // SAFETY: made above, destroyed once.
        unsafe {
            aclDestroyTensor(self4);
            aclDestroyTensor(out4);
            aclDestroyScalar(al);
        }
    }

    #[test]
    fn embedding_backward_sums_rows_in_place() {
        // 4 positions of width 2 into a table of 3 rows; row 1 twice, padding index 2.
        let gv = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let g = Dev::f32(&gv, &[4, 2]);
        let idx = Dev::new(&[1i64, 0, 1, 2], &[4], ACL_INT64);
        let out = Dev::f32(&[f32::NAN; 6], &[3, 2]);
        let (ws, ex) = phase1_ok(|w, e| {
            // SAFETY: live handles from this test and valid out-pointers.
            unsafe {
                aclnnEmbeddingDenseBackwardGetWorkspaceSize(g.t, idx.t, 3, 2, false, out.t, w, e)
            }
        });
        launch(ws, ex, aclnnEmbeddingDenseBackward).unwrap();
        assert_eq!(out.get::<f32>(), vec![3.0, 4.0, 6.0, 8.0, 0.0, 0.0]);
    }
}

mod descriptors {
    use super::*;

    #[test]
    fn create_tensor_validates_its_arguments() {
        let addr = crate::mem::alloc(0, 64).unwrap();
        let dims = [4i64, 4];
        let strides = [4i64, 1];
        let mk = |dims: &[i64],
                  strides: &[i64],
                  offset: i64,
                  format: aclFormat,
                  dtype: aclDataType,
                  storage: &[i64],
                  data: usize| {
            // SAFETY: arrays of the given lengths.
            let t = unsafe {
                aclCreateTensor(
                    dims.as_ptr(),
                    dims.len() as u64,
                    dtype,
                    strides.as_ptr(),
                    offset,
                    format,
                    storage.as_ptr(),
                    storage.len() as u64,
                    data as *mut c_void,
                )
            };
            if t.is_null() {
                Err(crate::error::take_recent().unwrap())
            } else {
                // SAFETY: live.
                unsafe { aclDestroyTensor(t) };
                Ok(())
            }
        };
        mk(&dims, &strides, 0, ACL_FORMAT_ND, ACL_FLOAT, &dims, addr).unwrap();
        let e = mk(&[-1, 4], &strides, 0, ACL_FORMAT_ND, ACL_FLOAT, &dims, addr).unwrap_err();
        assert!(e.contains("negative"), "{e}");
        // Offset and format swapped (the known CANN bug): format 0 is NCHW, offset 2 runs past.
        let e = mk(&dims, &strides, 2, 77, ACL_FLOAT, &dims, addr).unwrap_err();
        assert!(e.contains("not a known aclFormat"), "{e}");
        let e = mk(&dims, &strides, 0, ACL_FORMAT_ND, 99, &dims, addr).unwrap_err();
        assert!(e.contains("not a known aclDataType"), "{e}");
        let e = mk(&dims, &strides, 1, ACL_FORMAT_ND, ACL_FLOAT, &dims, addr).unwrap_err();
        assert!(e.contains("storage dims"), "{e}");
        let host = [0f32; 16];
        let e = mk(
            &dims,
            &strides,
            0,
            ACL_FORMAT_ND,
            ACL_FLOAT,
            &dims,
            host.as_ptr() as usize,
        )
        .unwrap_err();
        assert!(e.contains("not device memory"), "{e}");
        let e = mk(&dims, &strides, 0, ACL_FORMAT_ND, ACL_FLOAT, &dims, 0).unwrap_err();
        assert!(e.contains("null"), "{e}");
        // A storage larger than the allocation (64 bytes = 16 f32).
        let e = mk(
            &[5, 4],
            &strides,
            0,
            ACL_FORMAT_ND,
            ACL_FLOAT,
            &[5, 4],
            addr,
        )
        .unwrap_err();
        assert!(e.contains("runs past"), "{e}");
        crate::mem::free(addr).unwrap();
    }

    #[test]
    fn destroyed_descriptors_are_errors() {
        let v = [1i64, 2, 3];
        // SAFETY: 3 values.
        let a = unsafe { aclCreateIntArray(v.as_ptr(), 3) };
        assert!(!a.is_null());
        // SAFETY: handles are only looked up.
        unsafe {
            assert_eq!(aclDestroyIntArray(a), 0);
            assert_eq!(aclDestroyIntArray(a), PARAM_INVALID);
        }
        let m = crate::error::take_recent().unwrap();
        assert!(
            m.contains("aclDestroyIntArray") && m.contains("not a live aclIntArray"),
            "{m}"
        );
    }
}

mod gelu {
    use super::*;
    use crate::ops::gelu::*;

    /// erf(z) in f64 by its everywhere-convergent series of positive terms (independent of
    /// the kernel's Chebyshev fit): erf(z) = 2/sqrt(pi) e^(-z^2) sum 2^n z^(2n+1) / (2n+1)!!.
    fn erf(z: f64) -> f64 {
        let (mut term, mut sum, mut n) = (z, z, 0.0);
        while term.abs() > 1e-18 * sum.abs().max(1e-300) {
            n += 1.0;
            term *= 2.0 * z * z / (2.0 * n + 1.0);
            sum += term;
        }
        2.0 / std::f64::consts::PI.sqrt() * (-z * z).exp() * sum
    }

    fn phi(x: f64) -> f64 {
        0.5 * (1.0 + erf(x / 2f64.sqrt()))
    }

    const X: [f32; 6] = [-3.0, -1.25, -0.1, 0.0, 0.7, 2.5];

    #[test]
    fn forward_and_backward_are_the_erf_form() {
        let x = Dev::f32(&X, &[2, 3]);
        let y = Dev::f32(&[0.0; 6], &[2, 3]);
        let (ws, ex) = phase1_ok(|w, e| {
            // SAFETY: live handles from this test and valid out-pointers.
            unsafe { aclnnGeluV2GetWorkspaceSize(x.t, 0, y.t, w, e) }
        });
        launch(ws, ex, aclnnGeluV2).unwrap();
        for (got, &v) in y.get::<f32>().iter().zip(&X) {
            let want = v as f64 * phi(v as f64);
            // The kernel's erfc fit is good to ~2e-7 relative, plus f32 roundings.
            assert!(
                (*got as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "{v}: {got} vs {want}"
            );
        }
        // gradOutput [3] broadcast against self [2, 3]; gradInput written, not accumulated.
        let dy = Dev::f32(&[1.0, -2.0, 0.5], &[3]);
        let dx = Dev::f32(&[100.0; 6], &[2, 3]);
        let mut mode = *b"none\0";
        let (ws, ex) = phase1_ok(|w, e| {
            // SAFETY: live handles, a NUL-terminated mode and valid out-pointers.
            unsafe {
                aclnnGeluBackwardV2GetWorkspaceSize(dy.t, x.t, mode.as_mut_ptr().cast(), dx.t, w, e)
            }
        });
        launch(ws, ex, aclnnGeluBackwardV2).unwrap();
        let pdf = |v: f64| (-0.5 * v * v).exp() / (2.0 * std::f64::consts::PI).sqrt();
        for (i, (got, &v)) in dx.get::<f32>().iter().zip(&X).enumerate() {
            let v = v as f64;
            let want = [1.0, -2.0, 0.5][i % 3] * (phi(v) + v * pdf(v));
            assert!(
                (*got as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "{v}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn modes_shapes_and_nulls_are_checked() {
        let x = Dev::f32(&X, &[6]);
        let y = Dev::f32(&[0.0; 6], &[6]);
        let short = Dev::f32(&[0.0; 5], &[5]);
        let m = phase1_err(|w, e| {
            // SAFETY: live handles from this test and valid out-pointers.
            unsafe { aclnnGeluV2GetWorkspaceSize(x.t, 1, y.t, w, e) }
        });
        assert!(m.contains("tanh") && m.contains("not implemented"), "{m}");
        let m = phase1_err(|w, e| {
            // SAFETY: as above.
            unsafe { aclnnGeluV2GetWorkspaceSize(x.t, 2, y.t, w, e) }
        });
        assert!(m.contains("approximate 2"), "{m}");
        let m = phase1_err(|w, e| {
            // SAFETY: as above.
            unsafe { aclnnGeluV2GetWorkspaceSize(x.t, 0, short.t, w, e) }
        });
        assert!(m.contains("shape"), "{m}");
        let h = Dev::new(&[0u16; 6], &[6], ACL_BF16);
        let m = phase1_err(|w, e| {
            // SAFETY: as above.
            unsafe { aclnnGeluV2GetWorkspaceSize(x.t, 0, h.t, w, e) }
        });
        assert!(m.contains("y has dtype BFLOAT16"), "{m}");
        let m = phase1_err(|w, e| {
            // SAFETY: a null mode is the error under test.
            unsafe {
                aclnnGeluBackwardV2GetWorkspaceSize(x.t, x.t, std::ptr::null_mut(), y.t, w, e)
            }
        });
        assert!(m.contains("approximate is null"), "{m}");
        let mut bad = *b"erf\0";
        let m = phase1_err(|w, e| {
            // SAFETY: live handles, a NUL-terminated mode.
            unsafe {
                aclnnGeluBackwardV2GetWorkspaceSize(x.t, x.t, bad.as_mut_ptr().cast(), y.t, w, e)
            }
        });
        assert!(m.contains("\"erf\""), "{m}");
        let mut none = *b"none\0";
        let m = phase1_err(|w, e| {
            // SAFETY: live handles, a NUL-terminated mode.
            unsafe {
                aclnnGeluBackwardV2GetWorkspaceSize(
                    x.t,
                    x.t,
                    none.as_mut_ptr().cast(),
                    short.t,
                    w,
                    e,
                )
            }
        });
        assert!(m.contains("gradInput has shape [5]"), "{m}");
    }
}
