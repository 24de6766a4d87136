//! The C boundary of libnnopbase's exports: each runs its body through [`ffi_status`] or
//! [`ffi_handle`], which record the error for `aclGetRecentErrMsg` and stop panics. A leaf
//! below the descriptor functions (`nnopbase`) and the executors (`executor`), which both use it.

use crate::error::{record, EmuError, EmuResult};

/// ACLNN_ERR_INNER: what a panic inside the emulator becomes at the C boundary.
pub const INNER: i32 = 561000;

/// Runs an exported function's body: its error is recorded for `aclGetRecentErrMsg` and its
/// code returned; a panic never crosses the C boundary (it becomes ACLNN_ERR_INNER).
pub fn ffi_status(function: &str, f: impl FnOnce() -> EmuResult<()>) -> i32 {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => record(function, e),
        Err(p) => record(function, EmuError::new(INNER, panic_text(&p))),
    }
}

/// As [`ffi_status`] for the creation functions: the handle, or null with the error recorded.
pub fn ffi_handle<T>(function: &str, f: impl FnOnce() -> EmuResult<usize>) -> *mut T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(h)) => h as *mut T,
        Ok(Err(e)) => {
            record(function, e);
            std::ptr::null_mut()
        }
        Err(p) => {
            record(function, EmuError::new(INNER, panic_text(&p)));
            std::ptr::null_mut()
        }
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    format!("internal error in the emulator (panic): {what}")
}
