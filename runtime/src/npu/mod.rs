//! The NPU side of the runtime (feature `npu`): AscendCL devices, streams, events, memory and
//! pinned host buffers ([`PinnedHostBuffer`]) for asynchronous copies.
//!
//! cudarc's layering: [`result`] turns every `aclError` into a typed [`crate::Error`] (still
//! `unsafe`, one function per C call we use); the safe types ([`NpuStream`], [`NpuEvent`], the
//! allocator's raw memory `AclMemory`, handed out by `raw_memory`) own their handles and release them on drop,
//! recording failures instead of panicking. Within the module, lowest first: `result`;
//! `context` (aclInit, the thread's device binding); `stream` and `memory`; `pinned` and
//! `copy`; this file only re-exports and hands out the raw memory. Nothing here can run without CANN; it compiles
//! everywhere, and `tests/npu_emulator.rs` runs it against the host emulation of CANN
//! (`cannon-cann-emu`, selected through `cannon_sys::emulator`).

mod context;
pub(crate) mod copy;
mod memory;
pub(crate) mod pinned;
pub mod result;
mod stream;

pub(crate) use context::bind;
pub use context::{device_count, init};
pub use pinned::PinnedHostBuffer;
pub use stream::{NpuEvent, NpuStream};

use crate::alloc::raw::RawMemory;
use crate::error::Result;

/// The raw memory of NPU `ordinal` for a caching allocator (the device module builds the
/// process-wide allocator from it; this module does not know the allocator).
pub(crate) fn raw_memory(ordinal: u32) -> Result<Box<dyn RawMemory>> {
    context::bind(ordinal)?;
    Ok(Box::new(memory::AclMemory { ordinal }))
}
