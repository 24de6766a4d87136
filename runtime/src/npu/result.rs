//! The result layer: each AscendCL call we use, with its `aclError` turned into
//! [`Error::Acl`] (carrying the call's name and `aclGetRecentErrMsg`). Still `unsafe`: the
//! caller vouches for the handles and pointers.

use crate::error::{Error, Result};
use cannon_sys::acl;
use std::ffi::{c_void, CStr};

pub use acl::{
    aclrtMemcpyKind, ACL_ERROR_REPEAT_INITIALIZE, ACL_EVENT_SYNC, ACL_EVENT_TIME_LINE,
    ACL_MEMCPY_DEVICE_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST, ACL_MEMCPY_HOST_TO_DEVICE,
    ACL_MEM_MALLOC_HUGE_FIRST,
};

/// The most recent AscendCL error message of this thread, or "" if none.
pub fn recent_error_message() -> String {
    // SAFETY: aclGetRecentErrMsg returns a thread-local C string or null.
    match unsafe { acl::aclGetRecentErrMsg() } {
        Ok(p) if !p.is_null() => {
            // SAFETY: non-null pointers from aclGetRecentErrMsg are NUL-terminated strings
            // that live until the next ACL call on this thread; we copy it at once.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
        _ => String::new(),
    }
}

/// Turns the outcome of an ACL call into a typed result.
pub fn check(
    call: &'static str,
    r: std::result::Result<acl::aclError, cannon_sys::Error>,
) -> Result<()> {
    let code = r?;
    if code == 0 {
        return Ok(());
    }
    Err(Error::Acl {
        call,
        code,
        name: cannon_sys::acl_error_name(code),
        message: recent_error_message(),
    })
}

/// # Safety
/// Call once per process (the caller serialises).
pub unsafe fn init() -> Result<()> {
    // SAFETY: a null config path selects the defaults.
    let r = unsafe { acl::aclInit(std::ptr::null()) };
    if matches!(r, Ok(ACL_ERROR_REPEAT_INITIALIZE)) {
        return Ok(());
    }
    check("aclInit", r)
}

/// # Safety
/// AscendCL must be initialised.
pub unsafe fn device_count() -> Result<u32> {
    let mut n = 0u32;
    // SAFETY: n is a valid out-pointer.
    check("aclrtGetDeviceCount", unsafe {
        acl::aclrtGetDeviceCount(&mut n)
    })?;
    Ok(n)
}

/// # Safety
/// AscendCL must be initialised.
pub unsafe fn set_device(ordinal: u32) -> Result<()> {
    let id = i32::try_from(ordinal).map_err(|_| Error::Acl {
        call: "aclrtSetDevice",
        code: 107001,
        name: "ACL_ERROR_RT_INVALID_DEVICEID",
        message: format!("ordinal {ordinal} out of range"),
    })?;
    // SAFETY: plain call with a device id.
    check("aclrtSetDevice", unsafe { acl::aclrtSetDevice(id) })
}

/// Device memory of `bytes`; `Ok(None)` when the device reports out-of-memory.
///
/// # Safety
/// The device must be bound on this thread.
pub unsafe fn malloc(bytes: usize) -> Result<Option<*mut c_void>> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: p is a valid out-pointer; the policy value comes from acl_rt.h.
    let r = unsafe { acl::aclrtMalloc(&mut p, bytes, ACL_MEM_MALLOC_HUGE_FIRST) };
    if let Ok(code) = r {
        if cannon_sys::acl_error_is_oom(code) {
            return Ok(None);
        }
    }
    check("aclrtMalloc", r)?;
    Ok(Some(p))
}

/// # Safety
/// `p` came from [`malloc`] and is not used afterwards.
pub unsafe fn free(p: *mut c_void) -> Result<()> {
    // SAFETY: the caller guarantees p is a live allocation.
    check("aclrtFree", unsafe { acl::aclrtFree(p) })
}

/// Synchronous copy of `bytes` (`kind` is one of the ACL_MEMCPY_* constants).
///
/// # Safety
/// `dst` and `src` are valid for `bytes` on the sides `kind` names.
pub unsafe fn memcpy(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: aclrtMemcpyKind,
) -> Result<()> {
    // SAFETY: forwarded from the caller's guarantees.
    check("aclrtMemcpy", unsafe {
        acl::aclrtMemcpy(dst, bytes, src, bytes, kind)
    })
}

/// Asynchronous copy on `stream`.
///
/// # Safety
/// As [`memcpy`], plus: both pointers 64-byte aligned, host memory pinned, and both kept
/// alive until the stream has run the copy.
pub unsafe fn memcpy_async(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: aclrtMemcpyKind,
    stream: acl::aclrtStream,
) -> Result<()> {
    // SAFETY: forwarded from the caller's guarantees.
    check("aclrtMemcpyAsync", unsafe {
        acl::aclrtMemcpyAsync(dst, bytes, src, bytes, kind, stream)
    })
}

/// Zeroes `bytes` of device memory, ordered on `stream`.
///
/// # Safety
/// `dst` is device memory valid for `bytes`.
pub unsafe fn memset_async(dst: *mut c_void, bytes: usize, stream: acl::aclrtStream) -> Result<()> {
    // SAFETY: forwarded from the caller's guarantees.
    check("aclrtMemsetAsync", unsafe {
        acl::aclrtMemsetAsync(dst, bytes, 0, bytes, stream)
    })
}

/// Zeroes `bytes` of device memory synchronously.
///
/// # Safety
/// `dst` is device memory valid for `bytes`.
pub unsafe fn memset(dst: *mut c_void, bytes: usize) -> Result<()> {
    // SAFETY: forwarded from the caller's guarantees.
    check("aclrtMemset", unsafe {
        acl::aclrtMemset(dst, bytes, 0, bytes)
    })
}
