//! What a device has at run time: the number of NPUs and each device's caching allocator
//! (host memory for the CPU, addresses for the meta device, `aclrtMalloc` for an NPU).
//!
//! Methods of [`Device`] defined here, above [`crate::alloc`] and `crate::npu`, so that
//! `Device` itself stays a leaf value type.

use crate::alloc::{CachingAllocator, RawMemory};
use crate::device::Device;
use crate::error::Result;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

impl Device {
    /// Number of NPUs AscendCL reports; 0 when the build has no NPU support or CANN is absent.
    pub fn npu_count() -> usize {
        #[cfg(feature = "npu")]
        {
            crate::npu::device_count().unwrap_or(0)
        }
        #[cfg(not(feature = "npu"))]
        {
            0
        }
    }

    /// The process-wide caching allocator of this device, created on first use: host memory
    /// for the CPU, `aclrtMalloc` for an NPU (a typed error when the build or the machine has
    /// no NPU support).
    pub fn allocator(self) -> Result<Arc<CachingAllocator>> {
        static CPU: OnceLock<Arc<CachingAllocator>> = OnceLock::new();
        static META: OnceLock<Arc<CachingAllocator>> = OnceLock::new();
        static NPU: OnceLock<Mutex<HashMap<u32, Arc<CachingAllocator>>>> = OnceLock::new();
        let ordinal = match self {
            Device::Cpu => return Ok(CPU.get_or_init(CachingAllocator::new_cpu).clone()),
            Device::Meta => return Ok(META.get_or_init(CachingAllocator::new_meta).clone()),
            Device::Npu(ordinal) => ordinal,
        };
        let mut map = NPU.get_or_init(Default::default).lock();
        if let Some(a) = map.get(&ordinal) {
            return Ok(a.clone());
        }
        let a = CachingAllocator::with_raw(self, npu_memory(ordinal)?);
        map.insert(ordinal, a.clone());
        Ok(a)
    }

    /// A new caching allocator of this device that nothing else uses, so its figures are its
    /// owner's allocations alone (a model's tensors, without the operator workspaces and
    /// other users of the device that go to [`Device::allocator`]). Host memory for the
    /// CPU, `aclrtMalloc` for an NPU (a typed error when the build or the machine has no
    /// NPU support).
    pub fn private_allocator(self) -> Result<Arc<CachingAllocator>> {
        match self {
            Device::Cpu => Ok(CachingAllocator::new_cpu()),
            Device::Meta => Ok(CachingAllocator::new_meta()),
            Device::Npu(ordinal) => Ok(CachingAllocator::with_raw(self, npu_memory(ordinal)?)),
        }
    }
}

#[cfg(feature = "npu")]
fn npu_memory(ordinal: u32) -> Result<Box<dyn RawMemory>> {
    crate::npu::raw_memory(ordinal)
}

#[cfg(not(feature = "npu"))]
fn npu_memory(ordinal: u32) -> Result<Box<dyn RawMemory>> {
    Err(crate::Error::NotCompiled {
        what: "allocator",
        device: Device::Npu(ordinal),
    })
}
