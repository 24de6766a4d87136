//! Raw device memory for the caching allocator.

use super::result;
use crate::alloc::raw::RawMemory;
use crate::error::Result;

/// `aclrtMalloc`/`aclrtFree` on one NPU.
pub(crate) struct AclMemory {
    pub(crate) ordinal: u32,
}

impl RawMemory for AclMemory {
    fn raw_alloc(&self, bytes: usize) -> Result<Option<*mut u8>> {
        super::context::bind(self.ordinal)?;
        // SAFETY: the device is bound on this thread.
        let Some(p) = (unsafe { result::malloc(bytes) })? else {
            return Ok(None);
        };
        // Zeroed like host blocks, so "initialised memory" means the same on both sides.
        // SAFETY: p is a fresh allocation of `bytes`.
        if let Err(e) = unsafe { result::memset(p, bytes) } {
            // SAFETY: p came from malloc above and is not handed out.
            let _ = unsafe { result::free(p) };
            return Err(e);
        }
        Ok(Some(p as *mut u8))
    }

    unsafe fn raw_free(&self, ptr: *mut u8, _bytes: usize) -> Result<()> {
        super::context::bind(self.ordinal)?;
        // SAFETY: the caller guarantees ptr came from raw_alloc on this device.
        unsafe { result::free(ptr as *mut std::ffi::c_void) }
    }
}
