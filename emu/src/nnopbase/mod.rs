//! libnnopbase: the aclnn descriptor API (aclTensor, aclScalar, the arrays and lists), the
//! executors that op phase 1 hands out and phase 2 consumes, and `aclnnInit/Finalize`.
//!
//! Every descriptor lives in a [`Registry`]: a handle is the address of its registered
//! object, so a destroyed or foreign handle is `ACLNN_ERR_PARAM_INVALID` with a message, and
//! tests can count live descriptors (a leak is visible). Creation functions return null on
//! bad input, as CANN's do, and leave the reason behind `aclGetRecentErrMsg`.
//!
//! Files, lowest first: `boundary` (the C boundary every export runs through), [`tensor`],
//! [`access`], [`executor`]; the descriptor exports of this file sit above them.

// The exported functions keep the C headers' parameter names (camelCase).
#![allow(non_snake_case)]

pub mod access;
mod boundary;
pub mod executor;
pub mod tensor;

use crate::error::{EmuError, EmuResult};
use crate::handle::Registry;
pub use boundary::{ffi_handle, ffi_status, INNER};
use cannon_sys::aclnn::*;
use std::ffi::c_void;
use std::sync::Arc;
pub use tensor::{TensorDesc, PARAM_INVALID, PARAM_NULLPTR};

/// A host scalar, copied at creation (torch_npu passes stack locals).
#[derive(Debug, Clone)]
pub struct ScalarDesc {
    pub dtype: aclDataType,
    pub value: f64,
}

pub static TENSORS: Registry<TensorDesc> = Registry::new("aclTensor", PARAM_INVALID);
pub static SCALARS: Registry<ScalarDesc> = Registry::new("aclScalar", PARAM_INVALID);
pub static INT_ARRAYS: Registry<Vec<i64>> = Registry::new("aclIntArray", PARAM_INVALID);
pub static FLOAT_ARRAYS: Registry<Vec<f32>> = Registry::new("aclFloatArray", PARAM_INVALID);
pub static BOOL_ARRAYS: Registry<Vec<bool>> = Registry::new("aclBoolArray", PARAM_INVALID);
pub static TENSOR_LISTS: Registry<Vec<Arc<TensorDesc>>> =
    Registry::new("aclTensorList", PARAM_INVALID);
pub static SCALAR_LISTS: Registry<Vec<ScalarDesc>> = Registry::new("aclScalarList", PARAM_INVALID);

/// Live descriptors of every kind and live executors (leak checks).
pub fn live_objects() -> usize {
    TENSORS.len()
        + SCALARS.len()
        + INT_ARRAYS.len()
        + FLOAT_ARRAYS.len()
        + BOOL_ARRAYS.len()
        + TENSOR_LISTS.len()
        + SCALAR_LISTS.len()
        + executor::EXECUTORS.len()
}

/// `n` values at `p` copied out; null is an error unless `n == 0`.
///
/// # Safety
/// `p` points to `n` readable values (the C caller's contract).
unsafe fn host_slice<T: Copy>(what: &str, p: *const T, n: u64) -> EmuResult<Vec<T>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if p.is_null() {
        return Err(EmuError::new(
            PARAM_NULLPTR,
            format!("{what} is null but its size is {n}"),
        ));
    }
    if n > (1 << 32) {
        return Err(EmuError::new(
            PARAM_INVALID,
            format!("{what}: size {n} is not a plausible array length"),
        ));
    }
    // SAFETY: the caller's contract: `p` holds `n` values.
    Ok(unsafe { std::slice::from_raw_parts(p, n as usize) }.to_vec())
}

/// Reads a scalar of `dtype` at `p` as f64.
///
/// # Safety
/// `p` points to one value of `dtype`.
unsafe fn scalar_value(p: *const c_void, dtype: aclDataType) -> EmuResult<f64> {
    use cannon_sys::acl::*;
    // SAFETY (all arms): `p` holds one value of `dtype` (the caller's contract);
    // read_unaligned because C's stack locals need not be aligned for us.
    Ok(unsafe {
        match dtype {
            ACL_FLOAT => std::ptr::read_unaligned(p as *const f32) as f64,
            ACL_DOUBLE => std::ptr::read_unaligned(p as *const f64),
            ACL_FLOAT16 => half::f16::from_bits(std::ptr::read_unaligned(p as *const u16)).to_f64(),
            ACL_BF16 => half::bf16::from_bits(std::ptr::read_unaligned(p as *const u16)).to_f64(),
            ACL_INT8 => std::ptr::read_unaligned(p as *const i8) as f64,
            ACL_UINT8 => std::ptr::read_unaligned(p as *const u8) as f64,
            ACL_INT16 => std::ptr::read_unaligned(p as *const i16) as f64,
            ACL_INT32 => std::ptr::read_unaligned(p as *const i32) as f64,
            ACL_INT64 => std::ptr::read_unaligned(p as *const i64) as f64,
            ACL_BOOL => (std::ptr::read_unaligned(p as *const u8) != 0) as u8 as f64,
            other => {
                return Err(EmuError::new(
                    PARAM_INVALID,
                    format!("dataType {other} is not a scalar type aclCreateScalar accepts"),
                ))
            }
        }
    })
}

/// `aclCreateTensor`: validates the view against the storage, the dtype and format enums,
/// and that the data pointer is device memory whose allocation holds the whole storage.
///
/// # Safety
/// The C contract: the dims/stride arrays hold `viewDimsNum` values, storageDims
/// `storageDimsNum`.
#[no_mangle]
pub unsafe extern "C" fn aclCreateTensor(
    viewDims: *const i64,
    viewDimsNum: u64,
    dataType: aclDataType,
    stride: *const i64,
    offset: i64,
    format: aclFormat,
    storageDims: *const i64,
    storageDimsNum: u64,
    tensorData: *mut c_void,
) -> *mut aclTensor {
    ffi_handle("aclCreateTensor", || {
        if viewDimsNum > 0 && stride.is_null() {
            return Err(EmuError::new(
                PARAM_NULLPTR,
                "stride is null (strides must be given)",
            ));
        }
        // SAFETY: the caller's contract on the array lengths.
        let dims = unsafe { host_slice("viewDims", viewDims, viewDimsNum)? };
        // SAFETY: as above; stride has viewDimsNum entries.
        let strides = unsafe { host_slice("stride", stride, viewDimsNum)? };
        // SAFETY: as above.
        let storage = unsafe { host_slice("storageDims", storageDims, storageDimsNum)? };
        let t = TensorDesc::new(
            dims,
            strides,
            offset,
            format,
            dataType,
            storage,
            tensorData as usize,
        )?;
        Ok(TENSORS.insert(t))
    })
}

/// # Safety
/// `value` points to one value of `dataType`.
#[no_mangle]
pub unsafe extern "C" fn aclCreateScalar(
    value: *mut c_void,
    dataType: aclDataType,
) -> *mut aclScalar {
    ffi_handle("aclCreateScalar", || {
        if value.is_null() {
            return Err(EmuError::new(PARAM_NULLPTR, "value is null"));
        }
        // SAFETY: the caller's contract.
        let v = unsafe { scalar_value(value, dataType)? };
        Ok(SCALARS.insert(ScalarDesc {
            dtype: dataType,
            value: v,
        }))
    })
}

/// # Safety
/// `value` holds `size` values.
#[no_mangle]
pub unsafe extern "C" fn aclCreateIntArray(value: *const i64, size: u64) -> *mut aclIntArray {
    // SAFETY: the caller's contract.
    ffi_handle("aclCreateIntArray", || {
        Ok(INT_ARRAYS.insert(unsafe { host_slice("value", value, size)? }))
    })
}

/// # Safety
/// `value` holds `size` values.
#[no_mangle]
pub unsafe extern "C" fn aclCreateFloatArray(value: *const f32, size: u64) -> *mut aclFloatArray {
    // SAFETY: the caller's contract.
    ffi_handle("aclCreateFloatArray", || {
        Ok(FLOAT_ARRAYS.insert(unsafe { host_slice("value", value, size)? }))
    })
}

/// # Safety
/// `value` holds `size` values.
#[no_mangle]
pub unsafe extern "C" fn aclCreateBoolArray(value: *const bool, size: u64) -> *mut aclBoolArray {
    ffi_handle("aclCreateBoolArray", || {
        // Read as bytes: a C bool that is not 0/1 must not become an invalid Rust bool.
        // SAFETY: the caller's contract (one byte per C bool).
        let raw = unsafe { host_slice("value", value as *const u8, size)? };
        Ok(BOOL_ARRAYS.insert(raw.into_iter().map(|b| b != 0).collect()))
    })
}

/// # Safety
/// `value` holds `size` tensor handles.
#[no_mangle]
pub unsafe extern "C" fn aclCreateTensorList(
    value: *const *const aclTensor,
    size: u64,
) -> *mut aclTensorList {
    ffi_handle("aclCreateTensorList", || {
        // SAFETY: the caller's contract.
        let hs = unsafe { host_slice("value", value, size)? };
        let ts = hs
            .iter()
            .enumerate()
            .map(|(i, &h)| {
                TENSORS
                    .get(h as usize)
                    .map_err(|e| EmuError::new(e.code, format!("element {i}: {}", e.message)))
            })
            .collect::<EmuResult<Vec<_>>>()?;
        Ok(TENSOR_LISTS.insert(ts))
    })
}

/// # Safety
/// `value` holds `size` scalar handles.
#[no_mangle]
pub unsafe extern "C" fn aclCreateScalarList(
    value: *const *const aclScalar,
    size: u64,
) -> *mut aclScalarList {
    ffi_handle("aclCreateScalarList", || {
        // SAFETY: the caller's contract.
        let hs = unsafe { host_slice("value", value, size)? };
        let ss = hs
            .iter()
            .enumerate()
            .map(|(i, &h)| {
                SCALARS
                    .get(h as usize)
                    .map(|s| (*s).clone())
                    .map_err(|e| EmuError::new(e.code, format!("element {i}: {}", e.message)))
            })
            .collect::<EmuResult<Vec<_>>>()?;
        Ok(SCALAR_LISTS.insert(ss))
    })
}

macro_rules! destroy {
    ($name:ident, $ty:ty, $reg:ident) => {
        /// Frees the descriptor only (never device memory); a destroyed or foreign handle is
        /// ACLNN_ERR_PARAM_INVALID.
        ///
        /// # Safety
        /// None beyond the C signature: the handle is only looked up, never dereferenced.
        #[no_mangle]
        pub unsafe extern "C" fn $name(h: *const $ty) -> aclnnStatus {
            ffi_status(stringify!($name), || $reg.remove(h as usize).map(|_| ()))
        }
    };
}
destroy!(aclDestroyTensor, aclTensor, TENSORS);
destroy!(aclDestroyScalar, aclScalar, SCALARS);
destroy!(aclDestroyIntArray, aclIntArray, INT_ARRAYS);
destroy!(aclDestroyFloatArray, aclFloatArray, FLOAT_ARRAYS);
destroy!(aclDestroyBoolArray, aclBoolArray, BOOL_ARRAYS);
destroy!(aclDestroyTensorList, aclTensorList, TENSOR_LISTS);
destroy!(aclDestroyScalarList, aclScalarList, SCALAR_LISTS);

/// Rebinds a tensor's data to another device address (the storage must fit there too).
///
/// # Safety
/// None beyond the C signature: handles are looked up, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn aclSetRawTensorAddr(
    tensor: *mut aclTensor,
    addr: *mut c_void,
) -> aclnnStatus {
    ffi_status("aclSetRawTensorAddr", || {
        let t = TENSORS.get(tensor as usize)?;
        let storage: i64 = t.storage_dims.iter().product();
        if !addr.is_null() || t.numel() > 0 {
            crate::mem::resolve(addr as usize, storage.max(1) as usize * t.elem_size())?;
        }
        t.data
            .store(addr as usize, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    })
}

/// # Safety
/// `addr` is a writable out-pointer.
#[no_mangle]
pub unsafe extern "C" fn aclGetRawTensorAddr(
    tensor: *const aclTensor,
    addr: *mut *mut c_void,
) -> aclnnStatus {
    ffi_status("aclGetRawTensorAddr", || {
        if addr.is_null() {
            return Err(EmuError::new(PARAM_NULLPTR, "addr is null"));
        }
        let t = TENSORS.get(tensor as usize)?;
        // SAFETY: non-null out-pointer (the caller's contract).
        unsafe { *addr = t.addr() as *mut c_void };
        Ok(())
    })
}

/// Optional in CANN (samples only call aclInit); accepted with or without a config path.
///
/// # Safety
/// `configPath` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn aclnnInit(_configPath: *const std::ffi::c_char) -> aclnnStatus {
    0
}

/// # Safety
/// None.
#[no_mangle]
pub unsafe extern "C" fn aclnnFinalize() -> aclnnStatus {
    0
}

/// Test hook (not a CANN function): the number of live aclnn descriptors and executors, so a
/// caller's tests can show that every descriptor it created was destroyed and every executor
/// launched or destroyed.
#[no_mangle]
pub extern "C" fn cannon_emu_live_aclnn_objects() -> u64 {
    live_objects() as u64
}
