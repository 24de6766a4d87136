//! Emulated HCCL: every `Hccl*` function cannon binds, exported with the exact signatures of
//! `cannon_sys::hccl` (hccl.h of the torch-npu 2.14.0 wheel).
//!
//! Ranks are separate processes that meet over TCP (`transport.rs`, `bootstrap.rs`):
//! `HcclGetRootInfo` opens a listening socket in rank 0's process and writes its address and a
//! job nonce into the opaque root info; `HcclCommInitRootInfo` (collective, blocking, bounded by `HCCL_CONNECT_TIMEOUT`)
//! connects every pair of ranks. Collectives are queued on the given stream and run on its
//! worker thread (`comm.rs`), bounded by `HCCL_EXEC_TIMEOUT`; their failures surface at stream
//! synchronise and through `HcclGetCommAsyncError`.
//!
//! Arguments are checked as HCCL checks them before anything is queued: null pointers
//! (`HCCL_E_PTR`), counts and buffers (device memory of this communicator's device, large enough
//! for the call: `HCCL_E_PARA`), data types and reduce ops per collective (`dtype.rs`:
//! `HCCL_E_NOT_SUPPORT` for a type the collective does not take), roots and peers in range, the
//! stream on the communicator's device. HCCL itself rejects a null stream, unlike AscendCL's
//! runtime calls, and so does the emulator.

mod bootstrap;
mod comm;
mod dtype;
mod exports;
mod transport;

pub use exports::*;

use crate::error::{record, EmuError, EmuResult};
use crate::handle::Registry;
use cannon_sys::hccl::{HcclResult, HCCL_E_INTERNAL, HCCL_E_PARA, HCCL_E_PTR};
use std::panic::AssertUnwindSafe;

/// Live communicators. A destroyed handle is `HCCL_E_PARA` (a null one `HCCL_E_PTR`).
static COMMS: Registry<comm::Comm> = Registry::new("HcclComm", HCCL_E_PARA as i32);

/// Communicators alive in this process (leak checks in tests).
pub fn live_comms() -> usize {
    COMMS.len()
}

pub(crate) fn perr(code: HcclResult, message: impl Into<String>) -> EmuError {
    EmuError::new(code as i32, message)
}

/// The C boundary: runs `f`, records its error for `aclGetRecentErrMsg`, and turns a panic into
/// `HCCL_E_INTERNAL` instead of unwinding into C.
fn edge(name: &'static str, f: impl FnOnce() -> EmuResult<()>) -> HcclResult {
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
fn non_null<T>(p: *const T, what: &str) -> EmuResult<()> {
    if p.is_null() {
        return Err(perr(HCCL_E_PTR, format!("{what} is null")));
    }
    Ok(())
}

/// A pointer the emulator will read or write on the host (root info, out-parameters, the
/// AlltoAllV arrays): non-null and not device memory, whose host view faults.
fn host_ptr<T>(p: *const T, what: &str) -> EmuResult<()> {
    non_null(p, what)?;
    if crate::mem::is_device(p as usize) {
        return Err(perr(
            HCCL_E_PARA,
            format!("{what} points to device memory; HCCL reads it on the host"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
