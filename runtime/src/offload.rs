//! Host memory for what a device keeps off itself: a [`HostPool`] (a second caching
//! allocator on the host and, on an NPU, a copy stream and pinned host buffers), the
//! [`HostTensor`]s it holds, and [`CopyMark`]s that order the compute stream after its copies.
//! The trainer offloads activations and optimizer state through it.
//!
//! The pool's allocator is separate from the device's: the bytes that leave the device are
//! counted there (its `max_allocated` is the host side's peak), and the device allocator's
//! figures fall by as much.
//!
//! ```text
//! offload(b)   host copy queued, the device buffer kept until settle()   [device -> host]
//! settle()     waits for that copy, frees the device buffer
//! reload(h)    a new device buffer, its copy queued                      [host -> device]
//! mark(), wait()  later work on the compute stream waits for the reloads queued so far
//! ```
//!
//! On the CPU backend the "device" is the host too: a copy is a memcpy between the two
//! allocators' blocks, done when the call returns. On an NPU the host copies are pinned
//! (`aclrtMallocHost`, `npu::PinnedHostBuffer`) and both directions run on a second
//! stream: it waits for an event of the compute stream before it reads or writes (so it
//! never reads a buffer before the kernels that write it have run, nor writes a block the
//! compute stream may still read), and the compute stream waits for its event before the
//! reloaded buffers are used, so the copies overlap the work computed meanwhile. The device
//! buffer of an offload is freed only in `settle`, after its copy finished; callers that
//! settle one layer later get the same figures on both backends.
//!
//! What stays in the pool for long (the optimizer's state) is a settled [`HostTensor`] (no
//! device buffer) read and written in place: [`HostPool::reload_into`] copies it into a
//! device buffer the caller owns (an FSDP rank's staging buffer), [`HostPool::store_into`]
//! copies a device result back (synchronously), and [`HostTensor::to_vec`] /
//! [`HostTensor::write_at`] are the host's own reads and writes (checkpoints).
//!
//! For the meta device the pool's allocator is a meta one too: host tensors are counted as
//! real ones are, and no copy moves anything (a meta run measures the host side as well).
//!
//! Files: `host_tensor` (what the pool holds), then `pool` (the pool and its marks).

mod host_tensor;
mod pool;

pub use host_tensor::HostTensor;
pub use pool::{CopyMark, HostPool};

#[cfg(test)]
mod tests;
