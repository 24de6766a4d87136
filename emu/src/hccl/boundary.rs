//! The C boundary of the emulated HCCL: the live communicators, and what every exported
//! function does with its arguments and its outcome (null and host-pointer checks, the error
//! record for `aclGetRecentErrMsg`, panics stopped). Below `args` and the exports, which use it.

use super::comm;
use crate::error::{record, EmuError, EmuResult};
use crate::handle::Registry;
use cannon_sys::hccl::{HcclResult, HCCL_E_INTERNAL, HCCL_E_PARA, HCCL_E_PTR};
use std::panic::AssertUnwindSafe;

/// Live communicators. A destroyed handle is `HCCL_E_PARA` (a null one `HCCL_E_PTR`).
pub(super) static COMMS: Registry<comm::Comm> = Registry::new("HcclComm", HCCL_E_PARA as i32);

/// Communicators alive in this process (leak checks in tests).
pub fn live_comms() -> usize {
    COMMS.len()
}

pub(crate) fn perr(code: HcclResult, message: impl Into<String>) -> EmuError {
    EmuError::new(code as i32, message)
}

/// The C boundary: runs `f`, records its error for `aclGetRecentErrMsg`, and turns a panic into
/// `HCCL_E_INTERNAL` instead of unwinding into C.
pub(super) fn edge(name: &'static str, f: impl FnOnce() -> EmuResult<()>) -> HcclResult {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => record(name, e) as HcclResult,
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            record(
                name,
                perr(HCCL_E_INTERNAL, format!("internal emulator error: {what}")),
            ) as HcclResult
        }
    }
}

/// Rejects a null pointer argument.
pub(super) fn non_null<T>(p: *const T, what: &str) -> EmuResult<()> {
    if p.is_null() {
        return Err(perr(HCCL_E_PTR, format!("{what} is null")));
    }
    Ok(())
}

/// A pointer the emulator will read or write on the host (root info, out-parameters, the
/// AlltoAllV arrays): non-null and not device memory, whose host view faults.
pub(super) fn host_ptr<T>(p: *const T, what: &str) -> EmuResult<()> {
    non_null(p, what)?;
    if crate::mem::is_device(p as usize) {
        return Err(perr(
            HCCL_E_PARA,
            format!("{what} points to device memory; HCCL reads it on the host"),
        ));
    }
    Ok(())
}
