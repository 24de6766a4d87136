//! AscendCL's one initialisation per process and the calling thread's device binding.
//!
//! The lowest layer of `npu` above [`result`](super::result): the streams, events, memory and
//! pinned buffers of the sibling modules bind their device through here before every call.

use super::result;
use crate::error::Result;
use std::cell::Cell;
use std::sync::OnceLock;

/// Initialises AscendCL once per process (`aclInit(NULL)`); later calls return the first
/// outcome.
pub fn init() -> Result<()> {
    /// The first outcome, kept so later callers get the same typed error (a missing library
    /// stays `Error::Sys`, a failed aclInit stays `Error::Acl` with its code and message).
    #[derive(Clone)]
    enum Failed {
        Sys(cannon_sys::Error),
        Acl(i32, &'static str, String),
        Other(String),
    }
    static INIT: OnceLock<std::result::Result<(), Failed>> = OnceLock::new();
    let first = INIT.get_or_init(|| {
        // SAFETY: aclInit with a null config path is the documented default initialisation;
        // OnceLock runs it at most once per process.
        unsafe { result::init() }.map_err(|e| match e {
            crate::Error::Sys(s) => Failed::Sys(s),
            crate::Error::Acl {
                code,
                name,
                message,
                ..
            } => Failed::Acl(code, name, message),
            other => Failed::Other(other.to_string()),
        })
    });
    match first.clone() {
        Ok(()) => Ok(()),
        Err(Failed::Sys(s)) => Err(crate::Error::Sys(s)),
        Err(Failed::Acl(code, name, message)) => Err(crate::Error::Acl {
            call: "aclInit",
            code,
            name,
            message,
        }),
        Err(Failed::Other(message)) => Err(crate::Error::Acl {
            call: "aclInit",
            code: -1,
            name: "init failed",
            message,
        }),
    }
}

/// Number of NPUs visible to this process.
pub fn device_count() -> Result<usize> {
    init()?;
    // SAFETY: plain query after aclInit.
    Ok(unsafe { result::device_count() }? as usize)
}

thread_local! {
    /// The device this thread last bound with `aclrtSetDevice` (contexts are per thread).
    static BOUND: Cell<Option<u32>> = const { Cell::new(None) };
}

/// Makes `ordinal` the current device of the calling thread (AscendCL's current context is
/// thread-local, so every entry point binds before touching device state).
pub(crate) fn bind(ordinal: u32) -> Result<()> {
    if BOUND.with(|b| b.get()) == Some(ordinal) {
        return Ok(());
    }
    init()?;
    // SAFETY: aclrtSetDevice on an ordinal; an invalid ordinal is reported as an error code.
    unsafe { result::set_device(ordinal) }?;
    BOUND.with(|b| b.set(Some(ordinal)));
    Ok(())
}
