//! aclnnRmsNorm and aclnnRmsNormGrad (aclnn_rms_norm.h, aclnn_rms_norm_grad.h;
//! docs/cann-api.md §4), on cannon-kernels' RMSNorm.
//!
//! x `[..., D]`, gamma `[D]` (the trailing dim; the emulator takes a 1-D gamma), y like x,
//! rstd f32 with x's shape and the normalised dim set to 1. x and gamma FLOAT or BFLOAT16
//! (CANN also takes an f32 gamma under a bf16 x and FLOAT16; the emulator does not implement
//! those). The grad writes (does not accumulate) dx (x's dtype) and dgamma (f32, gamma's
//! shape).
#![allow(non_snake_case)]

use super::*;
use crate::aclnn_phase2;
use crate::nnopbase::executor::{phase1, OpJob, Plan};
use cannon_sys::aclnn::{aclOpExecutor, aclnnStatus};

/// Rows and width of x, with gamma checked against its trailing dim.
fn rows(x: &TensorDesc, gamma: &TensorDesc) -> EmuResult<(usize, usize)> {
    if gamma.dims.len() != 1 || x.dims.last() != gamma.dims.first() {
        return Err(invalid(format!(
            "gamma {:?} must be x's trailing dim (x {:?}; the emulator takes a 1-D gamma)",
            gamma.dims, x.dims
        )));
    }
    let d = gamma.dims[0] as usize;
    if d == 0 {
        return Err(invalid("the normalised dim is 0"));
    }
    Ok((x.numel() / d, d))
}

fn check_rstd(rstd: &TensorDesc, x: &TensorDesc) -> EmuResult<()> {
    check(rstd, "rstd", &[ACL_FLOAT])?;
    let mut want = x.dims.clone();
    if let Some(l) = want.last_mut() {
        *l = 1;
    }
    if rstd.dims != want {
        return Err(invalid(format!(
            "rstd has shape {:?}, expected {want:?} (x's with the normalised dim 1)",
            rstd.dims
        )));
    }
    Ok(())
}

fn common(x: &TensorDesc, gamma: &TensorDesc) -> EmuResult<()> {
    check(x, "x", FLOATS)?;
    check(gamma, "gamma", FLOATS)?;
    if gamma.dtype != x.dtype {
        return Err(invalid("gamma's dtype differs from x's (an f32 gamma under bf16 x is not implemented by the emulator)"));
    }
    Ok(())
}

/// # Safety
/// The C contract of aclnnRmsNormGetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnRmsNormGetWorkspaceSize(
    x: *const aclTensor,
    gamma: *const aclTensor,
    epsilon: f64,
    yOut: *const aclTensor,
    rstdOut: *const aclTensor,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers.
    unsafe {
        phase1("aclnnRmsNorm", workspaceSize, executor, || {
            let (x, g, y, r) = (
                tensor(x, "x")?,
                tensor(gamma, "gamma")?,
                tensor(yOut, "yOut")?,
                tensor(rstdOut, "rstdOut")?,
            );
            common(&x, &g)?;
            check(&y, "yOut", &[x.dtype])?;
            same_shape(&x, "x", &y, "yOut")?;
            check_rstd(&r, &x)?;
            if !(epsilon.is_finite() && epsilon >= 0.0) {
                return Err(invalid(format!(
                    "epsilon {epsilon} must be finite and >= 0"
                )));
            }
            let (_, d) = rows(&x, &g)?;
            let device = device_of(&[&x, &g, &y, &r])?;
            let eps = epsilon as f32;
            let job: OpJob = Arc::new(move || {
                crate::with_float!(x.dtype, E => {
                    let xv: Vec<E> = read_as(&x)?;
                    let gv: Vec<E> = read_as(&g)?;
                    let mut yv = xv.clone();
                    let mut rv = vec![0f32; xv.len() / d];
                    cannon_kernels::rmsnorm::host::rmsnorm_forward(&mut yv, &mut rv, &xv, &gv, d, eps).map_err(kernel)?;
                    access::write(&y, &yv)?;
                    access::write(&r, &rv)
                })
            });
            Ok(Plan {
                workspace: 4096,
                device,
                job,
            })
        })
    }
}

/// # Safety
/// The C contract of aclnnRmsNormGradGetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnRmsNormGradGetWorkspaceSize(
    dy: *const aclTensor,
    x: *const aclTensor,
    rstd: *const aclTensor,
    gamma: *const aclTensor,
    dxOut: *const aclTensor,
    dgammaOut: *const aclTensor,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers.
    unsafe {
        phase1("aclnnRmsNormGrad", workspaceSize, executor, || {
            let (dy, x, r, g) = (
                tensor(dy, "dy")?,
                tensor(x, "x")?,
                tensor(rstd, "rstd")?,
                tensor(gamma, "gamma")?,
            );
            let (dx, dg) = (tensor(dxOut, "dxOut")?, tensor(dgammaOut, "dgammaOut")?);
            common(&x, &g)?;
            check(&dy, "dy", &[x.dtype])?;
            check(&dx, "dxOut", &[x.dtype])?;
            check(&dg, "dgammaOut", &[ACL_FLOAT])?;
            same_shape(&x, "x", &dy, "dy")?;
            same_shape(&x, "x", &dx, "dxOut")?;
            same_shape(&g, "gamma", &dg, "dgammaOut")?;
            check_rstd(&r, &x)?;
            let (_, d) = rows(&x, &g)?;
            let device = device_of(&[&dy, &x, &r, &g, &dx, &dg])?;
            let job: OpJob = Arc::new(move || {
                crate::with_float!(x.dtype, E => {
                    let (dyv, xv, gv): (Vec<E>, Vec<E>, Vec<E>) = (read_as(&dy)?, read_as(&x)?, read_as(&g)?);
                    let rv: Vec<f32> = access::read(&r)?;
                    let mut dxv = vec![<E as cannon_runtime::Float>::from_f32(0.0); xv.len()];
                    let mut dgv = vec![0f32; d];
                    cannon_kernels::rmsnorm::host::rmsnorm_backward(&mut dxv, &mut dgv, &dyv, &xv, &gv, &rv, d).map_err(kernel)?;
                    access::write(&dx, &dxv)?;
                    access::write(&dg, &dgv)
                })
            });
            Ok(Plan {
                workspace: 4096,
                device,
                job,
            })
        })
    }
}

aclnn_phase2!(aclnnRmsNorm, aclnnRmsNormGrad);
