//! What the caching allocator asks of the memory under it: the [`RawMemory`] trait and the
//! alignment every block has.
//!
//! A leaf: the memories that implement it (the host's here in `alloc`, the meta device's in
//! [`crate::meta`], the NPU's in `crate::npu`) depend on it, and the allocator holds one
//! as a `Box<dyn RawMemory>`, so neither the allocator nor the backends depend on each other.

use crate::error::Result;

/// Every block starts at a multiple of this many bytes: AVX-512 loads on the host, and the
/// 64-byte alignment `aclrtMemcpyAsync` requires on the NPU.
pub const BLOCK_ALIGN: usize = 64;

/// Where raw blocks come from: host memory (`host`), the meta device's addresses
/// ([`crate::meta`]) and device memory (`crate::npu`), which implement this trait.
pub(crate) trait RawMemory: Send + Sync {
    /// A new zero-initialised block of `bytes` (a multiple of BLOCK_ROUND) aligned to
    /// BLOCK_ALIGN, or `None` when the device is out of memory.
    fn raw_alloc(&self, bytes: usize) -> Result<Option<*mut u8>>;
    /// # Safety
    /// `ptr` came from `raw_alloc(bytes)` on this object and is not used afterwards.
    unsafe fn raw_free(&self, ptr: *mut u8, bytes: usize) -> Result<()>;
    /// Makes a block just returned by `raw_alloc(bytes)` (not yet handed out) resident and
    /// holding zeros, and says whether it did; when it did, a caller that wants zeros need
    /// not write them. Memory that cannot do this cheaply says no (the default).
    fn prefault_zeroed(&self, _ptr: *mut u8, _bytes: usize) -> bool {
        false
    }
}
