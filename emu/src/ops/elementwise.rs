//! aclnnCast, aclnnAdd / Adds / InplaceAdd, aclnnMul / Muls / InplaceMul / InplaceMuls
//! (aclnn_cast.h, aclnn_add.h, aclnn_mul.h; docs/cann-api.md §4).
//!
//! Add and Mul broadcast `other` against `self` (numpy rules), as CANN documents; `out` must
//! have the broadcast shape. Arithmetic is done in f32 and rounded once on store, which for
//! f32 and bf16 operands is what cannon-kernels' elementwise kernels do.

#![allow(non_snake_case)]

use super::*;
use crate::aclnn_phase2;
use crate::nnopbase::executor::{phase1, Plan};
use cannon_sys::aclnn::{aclOpExecutor, aclnnStatus};

/// Dtypes aclnnCast converts between in the emulator (floats and the index integer types).
const CAST_TYPES: &[aclDataType] = &[ACL_FLOAT, ACL_BF16, ACL_INT32, ACL_INT64];

/// # Safety
/// The C contract of aclnnCastGetWorkspaceSize (handles from this library, writable
/// out-pointers).
#[no_mangle]
pub unsafe extern "C" fn aclnnCastGetWorkspaceSize(
    self_: *const aclTensor,
    dtype: aclDataType,
    out: *mut aclTensor,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers.
    unsafe {
        phase1("aclnnCast", workspaceSize, executor, || {
            let src = tensor(self_, "self")?;
            let dst = tensor(out, "out")?;
            check(&src, "self", CAST_TYPES)?;
            check(&dst, "out", CAST_TYPES)?;
            if dst.dtype != dtype {
                return Err(invalid(format!(
                    "dtype argument {dtype} differs from out's dtype {}",
                    dst.dtype
                )));
            }
            same_shape(&src, "self", &dst, "out")?;
            let device = device_of(&[&src, &dst])?;
            let job: crate::nnopbase::executor::OpJob = Arc::new(move || cast(&src, &dst));
            Ok(Plan {
                workspace: 0,
                device,
                job,
            })
        })
    }
}

fn is_float(d: aclDataType) -> bool {
    FLOATS.contains(&d)
}

fn cast(src: &Arc<TensorDesc>, dst: &Arc<TensorDesc>) -> EmuResult<()> {
    match (is_float(src.dtype), is_float(dst.dtype)) {
        (true, true) => crate::with_float!(src.dtype, A => {
            let a: Vec<A> = read_as(src)?;
            crate::with_float!(dst.dtype, B => {
                let mut b = vec![<B as cannon_runtime::Float>::from_f32(0.0); a.len()];
                cannon_kernels::cast::host::cast(&a, &mut b).map_err(kernel)?;
                access::write(dst, &b)
            })
        }),
        (true, false) => {
            // Float -> integer truncates toward zero, as torch's .to(int) does.
            let v = read_f32(src)?;
            write_ints(dst, v.into_iter().map(|x| x as i64).collect())
        }
        (false, true) => write_f32(
            dst,
            &read_i64(src)?
                .into_iter()
                .map(|x| x as f32)
                .collect::<Vec<_>>(),
        ),
        (false, false) => write_ints(dst, read_i64(src)?),
    }
}

fn write_ints(t: &Arc<TensorDesc>, v: Vec<i64>) -> EmuResult<()> {
    match t.dtype {
        ACL_INT64 => access::write(t, &v),
        ACL_INT32 => access::write(t, &v.into_iter().map(|x| x as i32).collect::<Vec<_>>()),
        d => Err(invalid(format!("internal: integer store to dtype {d}"))),
    }
}

/// How an elementwise op combines its operands.
#[derive(Clone, Copy)]
enum Kind {
    /// self + alpha * other
    Add(f32),
    Mul,
}

/// Shared phase 1 of the binary ops: `out = self (op) other` with `other` a tensor or a
/// scalar broadcast over `self`.
fn plan_binary(
    this: Arc<TensorDesc>,
    other: Result<Arc<TensorDesc>, f64>,
    out: Arc<TensorDesc>,
    kind: Kind,
) -> EmuResult<Plan> {
    check(&this, "self", FLOATS)?;
    check(&out, "out", FLOATS)?;
    if let Ok(o) = &other {
        check(o, "other", FLOATS)?;
        if o.dtype != this.dtype {
            // CANN promotes mixed dtypes; our callers never mix, and the emulator does not
            // implement promotion, so say so instead of guessing.
            return Err(invalid(format!(
                "self is {} and other is {}: mixed-dtype promotion is not implemented by the emulator",
                crate::nnopbase::tensor::dtype_name(this.dtype),
                crate::nnopbase::tensor::dtype_name(o.dtype)
            )));
        }
    }
    let shape = match &other {
        Ok(o) => broadcast_shape(&this.dims, &o.dims)?,
        Err(_) => this.dims.clone(),
    };
    if out.dims != shape {
        return Err(invalid(format!(
            "out has shape {:?}, the broadcast shape of the operands is {shape:?}",
            out.dims
        )));
    }
    if out.dtype != this.dtype {
        return Err(invalid("out's dtype differs from self's"));
    }
    let mut ts = vec![&this, &out];
    if let Ok(o) = &other {
        ts.push(o);
    }
    let device = device_of(&ts)?;
    let job: crate::nnopbase::executor::OpJob = Arc::new(move || {
        if binary_in_place(&this, &other, &out, kind)? {
            return Ok(());
        }
        let a = expand(&read_f32(&this)?, &this.dims, &out.dims);
        let b = match &other {
            Ok(o) => expand(&read_f32(o)?, &o.dims, &out.dims),
            Err(s) => vec![*s as f32; a.len()],
        };
        let r: Vec<f32> = match kind {
            Kind::Add(1.0) => a.iter().zip(&b).map(|(x, y)| x + y).collect(),
            Kind::Add(alpha) => a.iter().zip(&b).map(|(x, y)| x + alpha * y).collect(),
            Kind::Mul => a.iter().zip(&b).map(|(x, y)| x * y).collect(),
        };
        write_f32(&out, &r)
    });
    Ok(Plan {
        workspace: 0,
        device,
        job,
    })
}

/// `out = self (op) other` straight on device memory, for f32 operands of `out`'s shape (no
/// broadcast), contiguous, each either `out` itself or sharing no byte with it: a gradient
/// accumulated into a gathered group's (`g += dW`) is hundreds of MB, and the copying path
/// holds it three times on the host. False (nothing done) otherwise.
fn binary_in_place(
    this: &TensorDesc,
    other: &Result<Arc<TensorDesc>, f64>,
    out: &TensorDesc,
    kind: Kind,
) -> EmuResult<bool> {
    let fits = |t: &TensorDesc| {
        t.dtype == ACL_FLOAT
            && t.dims == out.dims
            && (access::reach(t) == access::reach(out) || access::disjoint(t, out))
    };
    let other_fits = match other {
        Ok(o) => fits(o),
        Err(_) => true,
    };
    if !fits(this) || !other_fits {
        return Ok(false);
    }
    let (Some(pa), Some(po)) = (
        access::contiguous_ptr::<f32>(this)?,
        access::contiguous_ptr::<f32>(out)?,
    ) else {
        return Ok(false);
    };
    let pb = match other {
        Ok(o) => match access::contiguous_ptr::<f32>(o)? {
            Some(p) => Ok(p as *const f32),
            None => return Ok(false),
        },
        Err(s) => Err(*s as f32),
    };
    let f: fn(f32, f32, f32) -> f32 = match kind {
        Kind::Add(_) => |x, y, alpha| x + alpha * y,
        Kind::Mul => |x, y, _| x * y,
    };
    let alpha = match kind {
        Kind::Add(a) => a,
        Kind::Mul => 1.0,
    };
    for i in 0..out.numel() {
        // SAFETY: the three views are contiguous with `out`'s numel elements in live device
        // memory (checked by `contiguous_ptr`), and each input is `out` itself or shares no
        // byte with it: element i of the inputs is read before element i of `out` is
        // written, and no other element is touched. This job is the only work on them.
        unsafe {
            let y = match pb {
                Ok(p) => *p.add(i),
                Err(s) => s,
            };
            *po.add(i) = f(*pa.add(i), y, alpha);
        }
    }
    Ok(true)
}

/// # Safety
/// The C contract of aclnnAddGetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnAddGetWorkspaceSize(
    self_: *const aclTensor,
    other: *const aclTensor,
    alpha: *const aclScalar,
    out: *mut aclTensor,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers.
    unsafe {
        phase1("aclnnAdd", workspaceSize, executor, || {
            let a = scalar(alpha, "alpha")? as f32;
            plan_binary(
                tensor(self_, "self")?,
                Ok(tensor(other, "other")?),
                tensor(out, "out")?,
                Kind::Add(a),
            )
        })
    }
}

/// # Safety
/// The C contract of aclnnAddsGetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnAddsGetWorkspaceSize(
    self_: *const aclTensor,
    other: *const aclScalar,
    alpha: *const aclScalar,
    out: *mut aclTensor,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers.
    unsafe {
        phase1("aclnnAdds", workspaceSize, executor, || {
            let a = scalar(alpha, "alpha")? as f32;
            let o = scalar(other, "other")?;
            plan_binary(
                tensor(self_, "self")?,
                Err(o),
                tensor(out, "out")?,
                Kind::Add(a),
            )
        })
    }
}

/// # Safety
/// The C contract of aclnnInplaceAddGetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnInplaceAddGetWorkspaceSize(
    selfRef: *mut aclTensor,
    other: *const aclTensor,
    alpha: *const aclScalar,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers.
    unsafe {
        phase1("aclnnInplaceAdd", workspaceSize, executor, || {
            let a = scalar(alpha, "alpha")? as f32;
            let s = tensor(selfRef, "selfRef")?;
            plan_binary(s.clone(), Ok(tensor(other, "other")?), s, Kind::Add(a))
        })
    }
}

/// # Safety
/// The C contract of aclnnMulGetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnMulGetWorkspaceSize(
    self_: *const aclTensor,
    other: *const aclTensor,
    out: *mut aclTensor,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers.
    unsafe {
        phase1("aclnnMul", workspaceSize, executor, || {
            plan_binary(
                tensor(self_, "self")?,
                Ok(tensor(other, "other")?),
                tensor(out, "out")?,
                Kind::Mul,
            )
        })
    }
}

/// # Safety
/// The C contract of aclnnMulsGetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnMulsGetWorkspaceSize(
    self_: *const aclTensor,
    other: *const aclScalar,
    out: *mut aclTensor,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers.
    unsafe {
        phase1("aclnnMuls", workspaceSize, executor, || {
            let o = scalar(other, "other")?;
            plan_binary(
                tensor(self_, "self")?,
                Err(o),
                tensor(out, "out")?,
                Kind::Mul,
            )
        })
    }
}

/// # Safety
/// The C contract of aclnnInplaceMulGetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnInplaceMulGetWorkspaceSize(
    selfRef: *mut aclTensor,
    other: *const aclTensor,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers.
    unsafe {
        phase1("aclnnInplaceMul", workspaceSize, executor, || {
            let s = tensor(selfRef, "selfRef")?;
            plan_binary(s.clone(), Ok(tensor(other, "other")?), s, Kind::Mul)
        })
    }
}

/// # Safety
/// The C contract of aclnnInplaceMulsGetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnInplaceMulsGetWorkspaceSize(
    selfRef: *mut aclTensor,
    other: *const aclScalar,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers.
    unsafe {
        phase1("aclnnInplaceMuls", workspaceSize, executor, || {
            let s = tensor(selfRef, "selfRef")?;
            let o = scalar(other, "other")?;
            plan_binary(s.clone(), Err(o), s, Kind::Mul)
        })
    }
}

aclnn_phase2!(
    aclnnCast,
    aclnnAdd,
    aclnnAdds,
    aclnnInplaceAdd,
    aclnnMul,
    aclnnMuls,
    aclnnInplaceMul,
    aclnnInplaceMuls
);
