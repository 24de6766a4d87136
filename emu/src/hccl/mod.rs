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
//!
//! Files, lowest first: `transport`, `dtype`, `work` (what a queued collective is),
//! `dev_bytes` (the device memory a job touches, in pieces); `comm` (a communicator's queued
//! collectives); `boundary` (the live communicators and the C boundary's checks);
//! `bootstrap`; `args` (the checks of the exports' arguments, and the queuing of a call);
//! then the C functions, which this file only re-exports: `lifecycle` (a communicator's life)
//! and `collectives`.

mod args;
mod bootstrap;
mod boundary;
mod collectives;
mod comm;
mod dev_bytes;
mod dtype;
mod lifecycle;
mod transport;
mod work;

pub use boundary::live_comms;
pub use collectives::*;
pub use lifecycle::*;

/// Runs the emulator's wire parsers over `bytes` as a peer could send them: the bootstrap
/// HELLO, rank 0's rank table, then frames until one is refused or the bytes run out; returns
/// how many frames were read. Not used by the emulator itself: it is what the wire's fuzz
/// target and its replay on stable run, so every length a peer declares is exercised.
pub fn parse_wire(mut bytes: &[u8]) -> usize {
    let r = &mut bytes;
    let _ = bootstrap::read_hello(r);
    let _ = bootstrap::read_table(r);
    let mut frames = 0;
    while transport::read_frame(r, transport::max_payload()).is_ok() {
        frames += 1;
    }
    frames
}

#[cfg(test)]
mod tests;
