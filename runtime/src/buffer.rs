//! `DeviceBuffer<T>`: an owned, typed, length-checked allocation on one device, and borrowed
//! views of sub-ranges.
//!
//! Rust analogies (cudarc's table): `DeviceBuffer<T>` ~ `Vec<T>`, `BufferView<'_, T>` ~ `&[T]`,
//! `BufferViewMut<'_, T>` ~ `&mut [T]`, [`Stream`](crate::Stream) ~ a thread that runs work in order.
//! Copies are named by direction: `clone_htod` (allocate + copy in), `memcpy_htod` (into an
//! existing buffer), `clone_dtoh` / `memcpy_dtoh`, `memcpy_dtod`. On the CPU the buffer's
//! memory is host memory and `as_host_slice` borrows it directly.
//!
//! The files: `owned` (the allocation and its accessors), `checks` (range, length and device
//! checks), `npu_copy` (the NPU copies), `view` (the views and the copies), `filled` (buffers
//! born zeroed or copied from the host), and with the `npu` feature `pinned` (asynchronous
//! copies to and from pinned host memory).

mod checks;
mod filled;
mod npu_copy;
mod owned;
#[cfg(feature = "npu")]
mod pinned;
mod view;

pub use checks::reinterpret_range;
pub use filled::Pending;
pub use owned::DeviceBuffer;
pub use view::{BufferView, BufferViewMut};

#[cfg(test)]
mod tests;
