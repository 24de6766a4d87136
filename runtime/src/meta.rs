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

use crate::alloc::{RawMemory, BLOCK_ALIGN};
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
mod tests {
    use crate::{CachingAllocator, Device, DeviceBuffer, Stream};

    /// A meta allocator counts and caches like a host one, request for request, and its
    /// buffers have sizes and no storage.
    #[test]
    fn meta_blocks_are_counted_as_host_blocks_are() {
        let (meta, host) = (CachingAllocator::new_meta(), CachingAllocator::new_cpu());
        let (ms, hs) = (Stream::new(Device::Meta).unwrap(), Stream::cpu());
        for (alloc, st) in [(&meta, &ms), (&host, &hs)] {
            let a = DeviceBuffer::<f32>::alloc_on(alloc, st, 1000).unwrap();
            let b = DeviceBuffer::<u8>::alloc_on(alloc, st, 77).unwrap();
            drop(a);
            let _c = DeviceBuffer::<f32>::alloc_on(alloc, st, 990).unwrap();
            drop(b);
        }
        let (m, h) = (meta.stats(), host.stats());
        assert_eq!(m, h);
        assert_eq!(m.peak_allocated, 4096 + 512);
        assert_eq!(
            m.num_device_allocs, 2,
            "the 990-float request reused the freed block"
        );

        let mut x = DeviceBuffer::<f32>::alloc_on(&meta, &ms, 4).unwrap();
        assert_eq!((x.len(), x.device()), (4, Device::Meta));
        assert!(x.as_host_slice().is_err());
        assert!(x.as_host_slice_mut().is_err());
        x.memcpy_htod(&ms, &[1.0, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!(
            x.clone_dtoh(&ms).unwrap(),
            vec![0.0; 4],
            "no storage: zeros back"
        );
        assert!(
            x.memcpy_htod(&ms, &[1.0]).is_err(),
            "lengths are still checked"
        );
        assert!(x.memcpy_htod(&hs, &[0.0; 4]).is_err(), "so are devices");
    }
}
