//! aclnnGeluV2 and aclnnGeluBackwardV2 (aclnn_gelu_v2.h, aclnn_gelu_backward_v2.h of CANN
//! 8.x), on cannon-kernels' exact (erf) GELU.
//!
//! - GeluV2: `x` and `y` of one shape and dtype; `approximate` an int64, 0 = "none" (erf),
//!   1 = "tanh".
//! - GeluBackwardV2: `gradOutput` and `self` broadcast against each other; `gradInput` has the
//!   broadcast shape; `approximate` a C string, "none" or "tanh". It writes (does not
//!   accumulate) the gradient.
//!
//! FLOAT or BFLOAT16, every tensor of one dtype (CANN also promotes mixed dtypes; the emulator
//! asks for one). The tanh form is valid on CANN but not implemented here: a clear error, not
//! the erf values under the wrong name.
#![allow(non_snake_case)]

use super::*;
use crate::aclnn_phase2;
use crate::nnopbase::executor::{phase1, OpJob, Plan};
use cannon_sys::aclnn::{aclOpExecutor, aclnnStatus};
use std::ffi::{c_char, CStr};

/// Checks a GELU approximation mode: Ok for the erf form, an error naming the value
/// otherwise.
fn erf_mode(mode: &str) -> EmuResult<()> {
    match mode {
        "none" => Ok(()),
        "tanh" => Err(invalid(
            "approximate \"tanh\" is valid on CANN but not implemented by the emulator (cannon \
             uses the erf form, \"none\")",
        )),
        other => Err(invalid(format!(
            "approximate {other:?} is not \"none\" or \"tanh\""
        ))),
    }
}

/// # Safety
/// The C contract of aclnnGeluV2GetWorkspaceSize (handles from this library, writable
/// out-pointers).
#[no_mangle]
pub unsafe extern "C" fn aclnnGeluV2GetWorkspaceSize(
    x: *const aclTensor,
    approximate: i64,
    y: *mut aclTensor,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers.
    unsafe {
        phase1("aclnnGeluV2", workspaceSize, executor, || {
            let (x, y) = (tensor(x, "x")?, tensor(y, "y")?);
            check(&x, "x", FLOATS)?;
            check(&y, "y", &[x.dtype])?;
            same_shape(&x, "x", &y, "y")?;
            match approximate {
                0 => {}
                1 => erf_mode("tanh")?,
                other => {
                    return Err(invalid(format!(
                        "approximate {other} is not 0 (\"none\") or 1 (\"tanh\")"
                    )))
                }
            }
            let device = device_of(&[&x, &y])?;
            let job: OpJob = Arc::new(move || {
                crate::with_float!(x.dtype, E => {
                    let xv: Vec<E> = read_as(&x)?;
                    let mut out = xv.clone();
                    cannon_kernels::gelu::host::gelu_forward(&mut out, &xv).map_err(kernel)?;
                    access::write(&y, &out)
                })
            });
            Ok(Plan {
                workspace: 0,
                device,
                job,
            })
        })
    }
}

/// # Safety
/// The C contract of aclnnGeluBackwardV2GetWorkspaceSize (`approximate` a C string).
#[no_mangle]
pub unsafe extern "C" fn aclnnGeluBackwardV2GetWorkspaceSize(
    gradOutput: *const aclTensor,
    self_: *const aclTensor,
    approximate: *mut c_char,
    gradInput: *mut aclTensor,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers; approximate is null or a C string.
    unsafe {
        phase1("aclnnGeluBackwardV2", workspaceSize, executor, || {
            let (dy, x, dx) = (
                tensor(gradOutput, "gradOutput")?,
                tensor(self_, "self")?,
                tensor(gradInput, "gradInput")?,
            );
            check(&x, "self", FLOATS)?;
            check(&dy, "gradOutput", &[x.dtype])?;
            check(&dx, "gradInput", &[x.dtype])?;
            if approximate.is_null() {
                return Err(EmuError::new(PARAM_NULLPTR, "approximate is null"));
            }
            // SAFETY: the caller's contract (a NUL-terminated string).
            erf_mode(&CStr::from_ptr(approximate).to_string_lossy())?;
            let shape = broadcast_shape(&dy.dims, &x.dims)?;
            if dx.dims != shape {
                return Err(invalid(format!(
                    "gradInput has shape {:?}, expected the broadcast shape {shape:?} of \
                     gradOutput {:?} and self {:?}",
                    dx.dims, dy.dims, x.dims
                )));
            }
            let device = device_of(&[&dy, &x, &dx])?;
            let job: OpJob = Arc::new(move || {
                crate::with_float!(x.dtype, E => {
                    let xv = expand(&read_as::<E>(&x)?, &x.dims, &shape);
                    let dyv = expand(&read_as::<E>(&dy)?, &dy.dims, &shape);
                    // Our kernel accumulates; the op writes: start from zeros.
                    let mut g = vec![<E as cannon_runtime::Float>::from_f32(0.0); xv.len()];
                    cannon_kernels::gelu::host::gelu_backward(&mut g, &dyv, &xv).map_err(kernel)?;
                    access::write(&dx, &g)
                })
            });
            Ok(Plan {
                workspace: 0,
                device,
                job,
            })
        })
    }
}

aclnn_phase2!(aclnnGeluV2, aclnnGeluBackwardV2);
