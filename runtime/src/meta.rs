//! The meta device's memory: blocks with an address and a size and no storage.
//!
//! torchtitan estimates a layout's memory by running its real training step on fake
//! tensors; [`crate::Device::Meta`] does the same through cannon's own code. Its caching
//! allocator is the ordinary one ([`crate::alloc`]) over `MetaMemory`, so every request is
//! rounded, cached, reused and counted (allocated, reserved, peaks) exactly as on a real
//! device: the figures of a meta run are those of the same run on memory. Buffers on it
//! refuse host access ([`crate::DeviceBuffer::as_host_slice`] is an error), copies to it do
//! nothing, copies from it give zeros (so host logic downstream, a loss or a norm, sees
//! finite numbers), and the kernels' meta backend checks operands and computes nothing.

use crate::alloc::raw::{RawMemory, BLOCK_ALIGN};
use crate::error::Result;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Addresses for the meta device's blocks: distinct, aligned, never dereferenced.
#[derive(Debug)]
pub(crate) struct MetaMemory {
    next: AtomicUsize,
}

impl Default for MetaMemory {
    fn default() -> Self {
        // Far from null and from any host mapping a stray dereference could hit by luck
        // (nothing dereferences them: host access to a meta buffer is an error).
        MetaMemory {
            next: AtomicUsize::new(1 << 44),
        }
    }
}

impl RawMemory for MetaMemory {
    fn raw_alloc(&self, bytes: usize) -> Result<Option<*mut u8>> {
        // Addresses are handed out once (blocks freed by the cache are not re-addressed):
        // 2^64 bytes of address space outlast any run.
        let step = bytes.div_ceil(BLOCK_ALIGN).max(1) * BLOCK_ALIGN;
        let at = self.next.fetch_add(step, Ordering::Relaxed);
        Ok(Some(at as *mut u8))
    }

    unsafe fn raw_free(&self, _ptr: *mut u8, _bytes: usize) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;
