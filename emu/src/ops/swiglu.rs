//! aclnnSwiGlu and aclnnSwiGluGrad (aclnn_swi_glu.h, aclnn_swi_glu_grad.h;
//! docs/cann-api.md §4), on cannon-kernels' SwiGLU.
//!
//! x is split in two halves A, B along `dim` (its size there even); `out = silu(A) * B` has
//! x's shape with that dim halved. The grad takes `yGrad` (out's shape) and x and writes
//! `[dA | dB]` (x's shape; it does not accumulate). FLOAT or BFLOAT16.
#![allow(non_snake_case)]

use super::*;
use crate::aclnn_phase2;
use crate::nnopbase::executor::{phase1, OpJob, Plan};
use cannon_sys::aclnn::{aclOpExecutor, aclnnStatus};

/// (outer, half, inner): x = `[outer, 2 * half, inner]` around `dim`, and out's shape.
fn split(x: &TensorDesc, dim: i64) -> EmuResult<((usize, usize, usize), Vec<i64>)> {
    let r = x.dims.len() as i64;
    let d = if dim < 0 { dim + r } else { dim };
    if !(0..r).contains(&d) {
        return Err(invalid(format!("dim {dim} is outside x's {r} dims")));
    }
    let d = d as usize;
    let size = x.dims[d];
    if size % 2 != 0 {
        return Err(invalid(format!(
            "x's size {size} along dim {dim} is odd; SwiGlu splits it in halves"
        )));
    }
    let outer: i64 = x.dims[..d].iter().product();
    let inner: i64 = x.dims[d + 1..].iter().product();
    let mut out = x.dims.clone();
    out[d] = size / 2;
    Ok(((outer as usize, (size / 2) as usize, inner as usize), out))
}

/// The A and B halves of `v` (x's values) as two contiguous vectors.
fn halves<T: Copy>(v: &[T], (outer, half, inner): (usize, usize, usize)) -> (Vec<T>, Vec<T>) {
    let blk = half * inner;
    let (mut a, mut b) = (
        Vec::with_capacity(outer * blk),
        Vec::with_capacity(outer * blk),
    );
    for o in 0..outer {
        a.extend_from_slice(&v[o * 2 * blk..o * 2 * blk + blk]);
        b.extend_from_slice(&v[o * 2 * blk + blk..(o + 1) * 2 * blk]);
    }
    (a, b)
}

/// # Safety
/// The C contract of aclnnSwiGluGetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnSwiGluGetWorkspaceSize(
    x: *const aclTensor,
    dim: i64,
    out: *const aclTensor,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers.
    unsafe {
        phase1("aclnnSwiGlu", workspaceSize, executor, || {
            let (x, out) = (tensor(x, "x")?, tensor(out, "out")?);
            check(&x, "x", FLOATS)?;
            check(&out, "out", &[x.dtype])?;
            let (s, want) = split(&x, dim)?;
            if out.dims != want {
                return Err(invalid(format!(
                    "out has shape {:?}, expected {want:?}",
                    out.dims
                )));
            }
            let device = device_of(&[&x, &out])?;
            let job: OpJob = Arc::new(move || {
                crate::with_float!(x.dtype, E => {
                    let xv: Vec<E> = read_as(&x)?;
                    let (a, b) = halves(&xv, s);
                    let mut h = a.clone();
                    cannon_kernels::swiglu::host::swiglu_forward(&mut h, &a, &b).map_err(kernel)?;
                    access::write(&out, &h)
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
/// The C contract of aclnnSwiGluGradGetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnSwiGluGradGetWorkspaceSize(
    yGrad: *const aclTensor,
    x: *const aclTensor,
    dim: i64,
    out: *const aclTensor,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers.
    unsafe {
        phase1("aclnnSwiGluGrad", workspaceSize, executor, || {
            let (dy, x, out) = (
                tensor(yGrad, "yGrad")?,
                tensor(x, "x")?,
                tensor(out, "out")?,
            );
            check(&x, "x", FLOATS)?;
            check(&dy, "yGrad", &[x.dtype])?;
            check(&out, "out", &[x.dtype])?;
            let (s, half_shape) = split(&x, dim)?;
            if dy.dims != half_shape {
                return Err(invalid(format!(
                    "yGrad has shape {:?}, expected {half_shape:?}",
                    dy.dims
                )));
            }
            same_shape(&x, "x", &out, "out")?;
            let device = device_of(&[&dy, &x, &out])?;
            let job: OpJob = Arc::new(move || {
                crate::with_float!(x.dtype, E => {
                    let xv: Vec<E> = read_as(&x)?;
                    let dh: Vec<E> = read_as(&dy)?;
                    let (a, b) = halves(&xv, s);
                    let zero = <E as cannon_runtime::Float>::from_f32(0.0);
                    let (mut da, mut db) = (vec![zero; a.len()], vec![zero; a.len()]);
                    cannon_kernels::swiglu::host::swiglu_backward(&mut da, &mut db, &dh, &a, &b).map_err(kernel)?;
                    let (outer, half, inner) = s;
                    let blk = half * inner;
                    let mut dx = Vec::with_capacity(xv.len());
                    for o in 0..outer {
                        dx.extend_from_slice(&da[o * blk..(o + 1) * blk]);
                        dx.extend_from_slice(&db[o * blk..(o + 1) * blk]);
                    }
                    access::write(&out, &dx)
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

aclnn_phase2!(aclnnSwiGlu, aclnnSwiGluGrad);
