//! Copies between host and NPU memory for `DeviceBuffer`.
//!
//! Host <-> device copies are synchronous `aclrtMemcpy` after the stream has drained, because
//! the async form needs pinned (`aclrtMallocHost`) host memory that a caller's `&[T]` is not;
//! device <-> device copies and memsets are ordered on the stream, with a synchronous
//! fallback when a view's address is not 64-byte aligned (an `aclrtMemcpyAsync` condition).

use super::result::{
    self, ACL_MEMCPY_DEVICE_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST, ACL_MEMCPY_HOST_TO_DEVICE,
};
use super::stream::NpuStream;
use crate::error::Result;
use std::ffi::c_void;

fn bytes<T>(n: usize) -> usize {
    n * std::mem::size_of::<T>()
}

/// Copies `src` to the device address `dst` after `s` has drained.
pub(crate) fn htod<T: Copy>(s: &NpuStream, src: &[T], dst: *mut T) -> Result<()> {
    s.synchronize()?;
    if src.is_empty() {
        return Ok(());
    }
    // SAFETY: dst is a device buffer of at least src.len() values (length checked by the
    // caller) and src is a live host slice; the copy is synchronous.
    unsafe {
        result::memcpy(
            dst as *mut c_void,
            src.as_ptr() as *const c_void,
            bytes::<T>(src.len()),
            ACL_MEMCPY_HOST_TO_DEVICE,
        )
    }
}

/// Copies from the device address `src` to `dst` after `s` has drained.
pub(crate) fn dtoh<T: Copy>(s: &NpuStream, src: *const T, dst: &mut [T]) -> Result<()> {
    s.synchronize()?;
    if dst.is_empty() {
        return Ok(());
    }
    // SAFETY: src is a device buffer of at least dst.len() values (checked by the caller);
    // the copy is synchronous and dst is an exclusive host slice.
    unsafe {
        result::memcpy(
            dst.as_mut_ptr() as *mut c_void,
            src as *const c_void,
            bytes::<T>(dst.len()),
            ACL_MEMCPY_DEVICE_TO_HOST,
        )
    }
}

/// Copies `n` values between device addresses, ordered on `s`.
pub(crate) fn dtod<T: Copy>(s: &NpuStream, src: *const T, dst: *mut T, n: usize) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let aligned = (src as usize).is_multiple_of(64) && (dst as usize).is_multiple_of(64);
    // SAFETY: both are device ranges of n values (checked by the caller); the buffers
    // outlive the stream's work because DeviceBuffer drop returns blocks to the caching
    // allocator, which only hands them out again in stream order on this process.
    unsafe {
        if aligned {
            result::memcpy_async(
                dst as *mut c_void,
                src as *const c_void,
                bytes::<T>(n),
                ACL_MEMCPY_DEVICE_TO_DEVICE,
                s.raw(),
            )
        } else {
            s.synchronize()?;
            result::memcpy(
                dst as *mut c_void,
                src as *const c_void,
                bytes::<T>(n),
                ACL_MEMCPY_DEVICE_TO_DEVICE,
            )
        }
    }
}

/// Zeroes `n` values at the device address `dst`, ordered on `s`.
pub(crate) fn memset_zeros<T: Copy>(s: &NpuStream, dst: *mut T, n: usize) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    // SAFETY: dst is a device range of n values (checked by the caller).
    unsafe { result::memset_async(dst as *mut c_void, bytes::<T>(n), s.raw()) }
}
