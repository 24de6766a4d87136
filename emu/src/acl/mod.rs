#![allow(non_snake_case)]
//! The AscendCL runtime subset (`libascendcl.so`): every function of sys/README.md's
//! "AscendCL runtime" list, exported with the exact C signature the loader's bindings declare
//! (`sys/src/generated/acl.rs`).
//!
//! - this file: `aclInit` / `aclFinalize` (once per process, as CANN), `aclrtGetVersion`,
//!   `aclGetRecentErrMsg`, and the guard every export runs its body in;
//! - [`context`]: devices (`aclrtSetDevice`, ...) and contexts;
//! - [`memory`]: `aclrtMalloc`/`Free`, pinned host memory, `aclrtMemcpy*`, `aclrtMemset*`,
//!   `aclrtGetMemInfo`;
//! - [`streams`]: streams and events.
//!
//! Every failure is the documented `aclError` plus a message recorded for
//! `aclGetRecentErrMsg`; a panic inside an export is caught at the C boundary and reported as
//! `ACL_ERROR_INTERNAL_ERROR`.

pub mod context;
pub mod memory;
mod signatures;
pub mod streams;

use crate::error::{self, EmuError, EmuResult};
use cannon_sys::acl::{
    aclError, ACL_ERROR_INTERNAL_ERROR, ACL_ERROR_INVALID_FILE, ACL_ERROR_INVALID_PARAM,
    ACL_ERROR_REPEAT_FINALIZE, ACL_ERROR_REPEAT_INITIALIZE, ACL_ERROR_UNINITIALIZE,
    ACL_MAJOR_VERSION, ACL_MINOR_VERSION, ACL_PATCH_VERSION,
};
use parking_lot::Mutex;
use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Where the process is in AscendCL's life cycle.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Life {
    Fresh,
    Initialised,
    Finalised,
}

static LIFE: Mutex<Life> = Mutex::new(Life::Fresh);

/// `Ok` when `aclInit` succeeded and `aclFinalize` has not run: every other AscendCL call
/// (and the aclnn / HCCL modules, which CANN also runs only after `aclInit`) checks this first.
pub fn require_init() -> EmuResult<()> {
    match *LIFE.lock() {
        Life::Initialised => Ok(()),
        Life::Fresh => Err(EmuError::new(
            ACL_ERROR_UNINITIALIZE,
            "AscendCL is not initialised: call aclInit first",
        )),
        Life::Finalised => Err(EmuError::new(
            ACL_ERROR_UNINITIALIZE,
            "AscendCL was finalised (aclFinalize) in this process",
        )),
    }
}

/// Runs an export's body: its result becomes the status code (the error recorded for
/// `aclGetRecentErrMsg` under `function`), and a panic becomes `ACL_ERROR_INTERNAL_ERROR`
/// instead of unwinding into C.
pub fn guard(function: &str, body: impl FnOnce() -> EmuResult<()>) -> aclError {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => error::status(function, r),
        Err(panic) => error::record(
            function,
            EmuError::new(
                ACL_ERROR_INTERNAL_ERROR,
                format!("internal error in the emulator: {}", panic_text(&panic)),
            ),
        ),
    }
}

/// `guard` for the calls that need `aclInit` first (all but init/finalize/version/errmsg).
pub fn guard_init(function: &str, body: impl FnOnce() -> EmuResult<()>) -> aclError {
    guard(function, || {
        require_init()?;
        body()
    })
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// Writes `value` through an out-pointer argument, or names the argument when it is null.
///
/// # Safety
/// A non-null `out` must be valid for a write of `T` (the C caller's contract).
pub unsafe fn write_out<T>(out: *mut T, name: &str, value: T) -> EmuResult<()> {
    if out.is_null() {
        return Err(EmuError::new(
            ACL_ERROR_INVALID_PARAM,
            format!("{name} is a null pointer"),
        ));
    }
    // SAFETY: non-null, and valid for writes by the caller's contract.
    unsafe { out.write(value) };
    Ok(())
}

/// # Safety
/// `configPath` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn aclInit(configPath: *const c_char) -> aclError {
    guard("aclInit", || {
        let mut life = LIFE.lock();
        match *life {
            Life::Initialised => {
                return Err(EmuError::new(
                    ACL_ERROR_REPEAT_INITIALIZE,
                    "aclInit was already called in this process",
                ))
            }
            Life::Finalised => {
                return Err(EmuError::new(
                    ACL_ERROR_REPEAT_INITIALIZE,
                    "aclInit after aclFinalize: AscendCL initialises once per process",
                ))
            }
            Life::Fresh => {}
        }
        if !configPath.is_null() {
            // SAFETY: a non-null config path is a C string (the caller's contract).
            let path = unsafe { CStr::from_ptr(configPath) }.to_string_lossy();
            // CANN reads the file as JSON; the emulator has no options, so it only checks that
            // a named file is there (an empty string means "no config", as in CANN's samples).
            if !path.is_empty() && !std::path::Path::new(path.as_ref()).is_file() {
                return Err(EmuError::new(
                    ACL_ERROR_INVALID_FILE,
                    format!("config file {path:?} does not exist"),
                ));
            }
        }
        *life = Life::Initialised;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn aclFinalize() -> aclError {
    guard("aclFinalize", || {
        let mut life = LIFE.lock();
        match *life {
            Life::Fresh => Err(EmuError::new(
                ACL_ERROR_UNINITIALIZE,
                "aclFinalize before aclInit",
            )),
            Life::Finalised => Err(EmuError::new(
                ACL_ERROR_REPEAT_FINALIZE,
                "aclFinalize was already called",
            )),
            Life::Initialised => {
                // Work still queued finishes first, as CANN's finalize waits for devices.
                crate::device::synchronize_everything();
                *life = Life::Finalised;
                Ok(())
            }
        }
    })
}

/// # Safety
/// Each out-pointer is null or valid for a write of `i32`.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetVersion(
    majorVersion: *mut i32,
    minorVersion: *mut i32,
    patchVersion: *mut i32,
) -> aclError {
    guard("aclrtGetVersion", || {
        // The version of the headers the bindings come from: what this emulation follows.
        // SAFETY: forwarded out-pointers (the caller's contract).
        unsafe {
            write_out(majorVersion, "majorVersion", ACL_MAJOR_VERSION as i32)?;
            write_out(minorVersion, "minorVersion", ACL_MINOR_VERSION as i32)?;
            write_out(patchVersion, "patchVersion", ACL_PATCH_VERSION as i32)
        }
    })
}

thread_local! {
    /// The string the last `aclGetRecentErrMsg` of this thread returned: it stays valid until
    /// the thread's next `aclGetRecentErrMsg`, as CANN documents.
    static RETURNED: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// The calling thread's most recent error message, or null when none was recorded since the
/// last call. The string stays valid until this thread calls `aclGetRecentErrMsg` again.
#[no_mangle]
pub extern "C" fn aclGetRecentErrMsg() -> *const c_char {
    catch_unwind(|| {
        let msg = error::take_recent().map(|m| {
            // Interior NULs would cut the message short in C; show them instead.
            CString::new(m.replace('\0', "\\0")).unwrap_or_default()
        });
        RETURNED.with(|r| {
            let mut r = r.borrow_mut();
            *r = msg;
            r.as_ref().map_or(std::ptr::null(), |c| c.as_ptr())
        })
    })
    .unwrap_or(std::ptr::null())
}

#[cfg(test)]
pub(crate) mod test_support {
    /// aclInit once for the unit tests of this process (they share it, as threads of one
    /// process share AscendCL).
    pub fn init() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        // SAFETY: null config path.
        ONCE.call_once(|| assert_eq!(unsafe { super::aclInit(std::ptr::null()) }, 0));
    }
}

#[cfg(test)]
mod tests;
