//! The calling thread's current device, as `aclrtSetDevice` leaves it (AscendCL binds devices
//! per thread), each device's default stream (what a null `aclrtStream` means), and the
//! synchronisation of all of a device's streams.
//!
//! It sits above [`crate::stream`] (the workers and the registry of created streams, which
//! know nothing of devices being current) and below `acl`, whose context and stream entry
//! points both call down here.

use crate::error::{EmuError, EmuResult};
use crate::stream::{Stream, STREAMS};
use cannon_sys::acl::ACL_ERROR_RT_CONTEXT_NULL;
use std::cell::Cell;
use std::sync::{Arc, OnceLock};

thread_local! {
    static CURRENT: Cell<Option<u32>> = const { Cell::new(None) };
}

/// Binds `d` to the calling thread (the caller validated `d`).
pub fn set_current(d: u32) {
    CURRENT.with(|c| c.set(Some(d)));
}

/// Unbinds the calling thread (`aclrtResetDevice` of its current device): later calls that
/// need a device fail as on a thread that never set one, instead of using the reset device.
pub fn clear_current() {
    CURRENT.with(|c| c.set(None));
}

/// The calling thread's device; an error when it never called `aclrtSetDevice` (CANN has no
/// implicit device 0).
pub fn current() -> EmuResult<u32> {
    CURRENT.with(|c| c.get()).ok_or_else(|| {
        EmuError::new(
            ACL_ERROR_RT_CONTEXT_NULL,
            "no current device on this thread: call aclrtSetDevice first",
        )
    })
}

/// Device `d`'s default stream (created on first use).
pub fn default_stream(d: u32) -> EmuResult<Arc<Stream>> {
    static DEFAULTS: OnceLock<Vec<OnceLock<Arc<Stream>>>> = OnceLock::new();
    let all = DEFAULTS.get_or_init(|| {
        (0..crate::mem::device_count())
            .map(|_| OnceLock::new())
            .collect()
    });
    let slot = all.get(d as usize).ok_or_else(|| {
        EmuError::new(
            cannon_sys::acl::ACL_ERROR_INVALID_PARAM,
            format!("device {d} does not exist"),
        )
    })?;
    if let Some(s) = slot.get() {
        return Ok(s.clone());
    }
    let s = Arc::new(Stream::new(d)?);
    Ok(slot.get_or_init(|| s).clone())
}

/// The stream an `aclrtStream` argument names: a created one, or for null the current
/// device's default stream.
pub fn lookup(handle: usize) -> EmuResult<Arc<Stream>> {
    if handle == 0 {
        return default_stream(current()?);
    }
    STREAMS.get(handle)
}

/// Synchronises every stream of device `d`, ignoring their errors (reset / finalize).
pub fn synchronize_device(d: u32) {
    let _ = synchronize_device_checked(d);
}

/// Synchronises every stream of device `d` (default stream included); the first error wins.
pub fn synchronize_device_checked(d: u32) -> EmuResult<()> {
    let mut first = None;
    let mut all: Vec<Arc<Stream>> = STREAMS.values();
    all.retain(|s| s.device == d);
    all.push(default_stream(d)?);
    for s in all {
        if let Err(e) = s.synchronize(None) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// Drains every stream of every device (aclFinalize).
pub fn synchronize_everything() {
    for d in 0..crate::mem::device_count() {
        synchronize_device(d);
    }
}
