//! The aclnn ops: each `aclnnXxxGetWorkspaceSize` validates its arguments as CANN documents
//! the op (docs/cann-api.md §3-4: dtypes, formats, shapes, null optionals, 32-byte aligned
//! addresses, ...) and plans a job that runs the CPU kernel of cannon-kernels on the resolved
//! host memory; `aclnnXxx` is the shared phase 2 (`nnopbase::executor`).

// The exported functions keep the C headers' parameter names (camelCase).
#![allow(non_snake_case)]

pub mod adamw;
pub mod attention;
pub mod elementwise;
pub mod embedding;
pub mod gelu;
pub mod loss;
pub mod matmul;
pub mod norm;
pub mod ring_update;
pub mod rope;
pub mod swiglu;

use crate::error::{EmuError, EmuResult};
use crate::nnopbase::{access, TensorDesc, PARAM_INVALID, PARAM_NULLPTR, SCALARS, TENSORS};
use cannon_sys::acl::*;
use cannon_sys::aclnn::{aclScalar, aclTensor};
use std::sync::Arc;

pub(crate) fn invalid(m: impl Into<String>) -> EmuError {
    EmuError::new(PARAM_INVALID, m)
}

/// The tensor behind a required argument.
pub(crate) fn tensor(h: *const aclTensor, name: &str) -> EmuResult<Arc<TensorDesc>> {
    if h.is_null() {
        return Err(EmuError::new(PARAM_NULLPTR, format!("{name} is null")));
    }
    TENSORS
        .get(h as usize)
        .map_err(|e| EmuError::new(e.code, format!("{name}: {}", e.message)))
}

/// The tensor behind an optional argument (null: absent).
pub(crate) fn opt_tensor(h: *const aclTensor, name: &str) -> EmuResult<Option<Arc<TensorDesc>>> {
    if h.is_null() {
        Ok(None)
    } else {
        tensor(h, name).map(Some)
    }
}

/// A required scalar's value.
pub(crate) fn scalar(h: *const aclScalar, name: &str) -> EmuResult<f64> {
    if h.is_null() {
        return Err(EmuError::new(PARAM_NULLPTR, format!("{name} is null")));
    }
    SCALARS
        .get(h as usize)
        .map(|s| s.value)
        .map_err(|e| EmuError::new(e.code, format!("{name}: {}", e.message)))
}

/// The float types (FLOAT, BFLOAT16) our ops' kernels run; CANN ops also take FLOAT16, which
/// the emulator does not implement (a clear error rather than a wrong answer).
pub(crate) const FLOATS: &[aclDataType] = &[ACL_FLOAT, ACL_BF16];

/// `t`'s dtype is one of `allowed`, its format a plain (not private, e.g. FRACTAL_NZ) one,
/// and its first element 32-byte aligned (CANN's rule for aclnn tensor addresses).
pub(crate) fn check(t: &TensorDesc, name: &str, allowed: &[aclDataType]) -> EmuResult<()> {
    if !allowed.contains(&t.dtype) {
        let names: Vec<String> = allowed
            .iter()
            .map(|&d| crate::nnopbase::tensor::dtype_name(d))
            .collect();
        return Err(invalid(format!(
            "{name} has dtype {}, the op supports {}{}",
            crate::nnopbase::tensor::dtype_name(t.dtype),
            names.join("/"),
            if t.dtype == ACL_FLOAT16 {
                " (FLOAT16 is valid on CANN but not implemented by the emulator)"
            } else {
                ""
            }
        )));
    }
    if !matches!(
        t.format,
        ACL_FORMAT_ND
            | ACL_FORMAT_NCHW
            | ACL_FORMAT_NHWC
            | ACL_FORMAT_NCL
            | ACL_FORMAT_NCDHW
            | ACL_FORMAT_NDHWC
    ) {
        return Err(invalid(format!(
            "{name} has format {}, the op takes ND (or a base format)",
            t.format
        )));
    }
    if t.numel() > 0 && !t.first_elem_addr().is_multiple_of(32) {
        return Err(invalid(format!(
            "{name}'s address {:#x} (data + offset) is not 32-byte aligned",
            t.first_elem_addr()
        )));
    }
    Ok(())
}

/// `a` and `b` have the same view shape.
pub(crate) fn same_shape(a: &TensorDesc, an: &str, b: &TensorDesc, bn: &str) -> EmuResult<()> {
    if a.dims != b.dims {
        return Err(invalid(format!(
            "{an} has shape {:?} but {bn} has {:?}",
            a.dims, b.dims
        )));
    }
    Ok(())
}

/// The device the tensors' memory lives on.
pub(crate) fn device_of(ts: &[&Arc<TensorDesc>]) -> EmuResult<Option<u32>> {
    let addrs: Vec<usize> = ts
        .iter()
        .filter(|t| t.numel() > 0)
        .map(|t| t.addr())
        .collect();
    crate::nnopbase::executor::common_device(&addrs)
}

/// A float tensor's values widened to f32.
pub(crate) fn read_f32(t: &Arc<TensorDesc>) -> EmuResult<Vec<f32>> {
    match t.dtype {
        ACL_FLOAT => access::read::<f32>(t),
        ACL_BF16 => Ok(access::read::<u16>(t)?
            .into_iter()
            .map(|b| half::bf16::from_bits(b).to_f32())
            .collect()),
        ACL_FLOAT16 => Ok(access::read::<u16>(t)?
            .into_iter()
            .map(|b| half::f16::from_bits(b).to_f32())
            .collect()),
        d => Err(invalid(format!("internal: read_f32 of dtype {d}"))),
    }
}

/// Stores f32 values into a float tensor, rounding to nearest even for the 16-bit types.
pub(crate) fn write_f32(t: &Arc<TensorDesc>, v: &[f32]) -> EmuResult<()> {
    match t.dtype {
        ACL_FLOAT => access::write(t, v),
        ACL_BF16 => access::write(
            t,
            &v.iter()
                .map(|&x| half::bf16::from_f32(x).to_bits())
                .collect::<Vec<u16>>(),
        ),
        ACL_FLOAT16 => access::write(
            t,
            &v.iter()
                .map(|&x| half::f16::from_f32(x).to_bits())
                .collect::<Vec<u16>>(),
        ),
        d => Err(invalid(format!("internal: write_f32 of dtype {d}"))),
    }
}

/// An integer tensor's values as i64.
pub(crate) fn read_i64(t: &Arc<TensorDesc>) -> EmuResult<Vec<i64>> {
    match t.dtype {
        ACL_INT64 => access::read::<i64>(t),
        ACL_INT32 => Ok(access::read::<i32>(t)?.into_iter().map(i64::from).collect()),
        ACL_UINT8 | ACL_BOOL => Ok(access::read::<u8>(t)?.into_iter().map(i64::from).collect()),
        d => Err(invalid(format!("internal: read_i64 of dtype {d}"))),
    }
}

/// The values of `t` in storage type `E` (f32 or bf16), for the generic CPU kernels.
pub(crate) fn read_as<E: cannon_runtime::Float>(t: &Arc<TensorDesc>) -> EmuResult<Vec<E>> {
    if E::DTYPE.size_bytes() != t.elem_size() {
        return Err(invalid("internal: read_as with a mismatched element type"));
    }
    access::read::<E>(t)
}

/// Runs `$body` with `$E` bound to the Rust storage type of the float dtype `$dt`.
#[macro_export]
macro_rules! with_float {
    ($dt:expr, $E:ident => $body:expr) => {
        match $dt {
            ::cannon_sys::acl::ACL_FLOAT => {
                type $E = f32;
                $body
            }
            ::cannon_sys::acl::ACL_BF16 => {
                type $E = ::half::bf16;
                $body
            }
            d => Err($crate::ops::invalid(format!(
                "internal: float dispatch on dtype {d}"
            ))),
        }
    };
}

/// A kernel error (shape mismatch the host checks missed) as an aclnn inner error.
pub(crate) fn kernel(e: cannon_kernels::KernelError) -> EmuError {
    EmuError::new(crate::nnopbase::INNER, e.to_string())
}

/// The broadcast shape of `a` and `b` (numpy rules), or an error naming both.
pub(crate) fn broadcast_shape(a: &[i64], b: &[i64]) -> EmuResult<Vec<i64>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let x = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let y = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = if x == y || y == 1 {
            x
        } else if x == 1 {
            y
        } else {
            return Err(invalid(format!("shapes {a:?} and {b:?} do not broadcast")));
        };
    }
    Ok(out)
}

/// Values of shape `from` expanded to shape `to` (which `from` broadcasts to).
pub(crate) fn expand<T: Copy>(v: &[T], from: &[i64], to: &[i64]) -> Vec<T> {
    if from == to {
        return v.to_vec();
    }
    let n: usize = to.iter().map(|&d| d as usize).product();
    let pad = to.len() - from.len();
    // Strides of `from` in `to`'s rank, 0 along broadcast dims.
    let mut fs = vec![0usize; to.len()];
    let mut acc = 1usize;
    for i in (0..from.len()).rev() {
        fs[i + pad] = if from[i] == 1 { 0 } else { acc };
        acc *= from[i] as usize;
    }
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0i64; to.len()];
    for _ in 0..n {
        let o: usize = idx.iter().zip(&fs).map(|(&i, &s)| i as usize * s).sum();
        out.push(v[o]);
        for d in (0..to.len()).rev() {
            idx[d] += 1;
            if idx[d] < to[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests;
