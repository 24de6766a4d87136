//! cannon-runtime: devices, streams, events, buffers with a caching allocator and torch-like
//! memory statistics, and communicators.
//!
//! The same API serves the CPU (the default backend, the reference, and a trainer of its
//! own) and Ascend NPUs (behind `--features npu`, over AscendCL and HCCL through
//! `cannon-sys`). Errors are typed ([`Error`]) and name the failing call and device; nothing
//! here panics on bad input, and errors met in `Drop` are recorded on the allocator
//! ([`CachingAllocator::take_drop_errors`]) instead of panicking.

pub mod alloc;
pub mod buffer;
pub mod comm;
pub mod device;
pub mod dtype;
pub mod error;
pub mod stream;

#[cfg(feature = "npu")]
pub mod npu;

pub use alloc::{CachingAllocator, MemoryStats};
pub use buffer::{BufferView, BufferViewMut, DeviceBuffer};
pub use device::Device;
pub use dtype::{DType, Element, Float};
pub use error::{Error, Result};
pub use stream::{Event, Stream};
