//! cannon-runtime: devices, streams, events, buffers with a caching allocator and torch-like
//! memory statistics, and communicators.
//!
//! The same API serves the CPU (the default backend, the reference, and a trainer of its
//! own) and Ascend NPUs (behind `--features npu`, over AscendCL and HCCL through
//! `cannon-sys`). Errors are typed ([`Error`]) and name the failing call and device; nothing
//! here panics on bad input, and errors met in `Drop` are recorded on the allocator
//! ([`CachingAllocator::take_drop_errors`]) instead of panicking.
//!
//! The boundary:
//! - Element types: one [`DType`], one sealed [`Element`] trait (what a [`DeviceBuffer`] holds
//!   and a collective moves), and [`Float`] (f32/bf16 activations, arithmetic in f32).
//! - Backends: [`Stream`], [`Event`] and [`comm::Communicator`] each hold an enum with one
//!   variant per compiled backend (CPU; NPU with the feature), never optional NPU fields.
//!   The `npu` module is the FFI edge (every AscendCL call and its `unsafe`); it depends on
//!   the allocator's `RawMemory` trait (a leaf), never on the allocator, and
//!   [`Device::allocator`] wires each device's memory into its [`CachingAllocator`].
//! - Collectives: [`comm::Communicator`] takes buffer views and a stream on every backend
//!   (in-process CPU ranks borrow the host slices; HCCL enqueues on the stream), so FSDP and
//!   context parallelism are written once.
//! - The meta device ([`Device::Meta`]): buffers with sizes and no storage, counted by the
//!   same caching allocator, so a step run on it measures a layout's memory at any size.
//!
//! Layering (a module imports only from the ones before it):
//! 1. [`dtype`], [`device`] (the [`Device`] value alone), [`host_count`], [`rng`];
//! 2. the error types: `comm::types` ([`comm::ReduceOp`]), `comm::error`
//!    ([`comm::CommError`]), then [`error`] ([`Error`] wraps `CommError`);
//! 3. `alloc::raw` (the `RawMemory` trait the backends implement), then `npu` (`result`,
//!    `context`, then its streams, memory, pinned buffers and copies);
//! 4. [`stream`] (over `npu`'s streams), [`trace`] (the step profiler's spans, over
//!    streams and events), [`meta`], then [`alloc`] with its host memory and cache;
//! 5. `device::backends`: [`Device::allocator`] and [`Device::npu_count`], where the
//!    allocator meets each backend's memory;
//! 6. [`buffer`] (over the allocator, streams and `npu`'s copies), then [`offload`] (a host
//!    pool over buffers, streams and `npu`'s pinned memory);
//! 7. [`comm`]: the backends (`cpu`, `solo`, `hccl`, the store and rendezvous), then
//!    [`comm::Communicator`] over them.

pub mod alloc;
pub mod buffer;
pub mod comm;
pub mod device;
pub mod dtype;
pub mod error;
pub mod host_count;
pub mod meta;
pub mod offload;
pub mod rng;
pub mod stream;
pub mod trace;

#[cfg(feature = "npu")]
pub mod npu;

pub use alloc::{CachingAllocator, MemoryStats};
pub use buffer::{BufferView, BufferViewMut, DeviceBuffer, Pending};
pub use device::Device;
pub use dtype::{DType, Element, Float};
pub use error::{Error, Result};
pub use offload::{CopyMark, HostPool, HostTensor};
pub use stream::{Event, Stream};
