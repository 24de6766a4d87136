//! Devices: the host CPU and Ascend NPUs by ordinal, and each device's process-wide caching
//! allocator. This is where the allocator (which knows only host memory and the `RawMemory`
//! trait) meets the backends' device memory (`crate::npu` implements `RawMemory`), so neither
//! of the two depends on the other.

use crate::alloc::{CachingAllocator, RawMemory};
use crate::error::Result;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

/// Where memory lives and work runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Device {
    /// The host. Work runs in order on the calling thread (kernels use the rayon pool).
    Cpu,
    /// An Ascend NPU, by `aclrtSetDevice` ordinal.
    Npu(u32),
}

impl Device {
    pub fn is_cpu(self) -> bool {
        matches!(self, Device::Cpu)
    }

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
        static NPU: OnceLock<Mutex<HashMap<u32, Arc<CachingAllocator>>>> = OnceLock::new();
        let ordinal = match self {
            Device::Cpu => return Ok(CPU.get_or_init(CachingAllocator::new_cpu).clone()),
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
            Device::Npu(ordinal) => Ok(CachingAllocator::with_raw(self, npu_memory(ordinal)?)),
        }
    }

    /// Parses `cpu`, `npu` (= `npu:0`) or `npu:N`, the spelling of `--device`.
    pub fn parse(s: &str) -> Option<Device> {
        match s {
            "cpu" => Some(Device::Cpu),
            "npu" => Some(Device::Npu(0)),
            _ => s
                .strip_prefix("npu:")
                .and_then(|n| n.parse().ok())
                .map(Device::Npu),
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

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Npu(i) => write!(f, "npu:{i}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_round_trips_display() {
        for d in [Device::Cpu, Device::Npu(0), Device::Npu(7)] {
            assert_eq!(Device::parse(&d.to_string()), Some(d));
        }
        assert_eq!(Device::parse("npu"), Some(Device::Npu(0)));
        assert_eq!(Device::parse("gpu"), None);
        assert_eq!(Device::parse("npu:x"), None);
    }
}
