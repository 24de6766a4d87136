//! Devices: the host CPU, Ascend NPUs by ordinal and the meta device, and each device's
//! process-wide caching allocator. This is where the allocator (which knows only host memory and the `RawMemory`
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
    /// Buffers with a size and no storage (torch's `meta`): its allocator counts blocks as
    /// any device's does, ops check their operands and compute nothing, copies to the host
    /// give zeros. A training step on meta ranks measures what a layout allocates, at any
    /// model size, in host memory of a few tensors' metadata ([`crate::meta`]).
    Meta,
}

impl Device {
    pub fn is_cpu(self) -> bool {
        matches!(self, Device::Cpu)
    }

    pub fn is_meta(self) -> bool {
        matches!(self, Device::Meta)
    }

    /// Whether work on this device is complete when the call that issues it returns (the
    /// host, and the meta device, which does none): no stream ordering to track.
    pub fn runs_inline(self) -> bool {
        matches!(self, Device::Cpu | Device::Meta)
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

    /// Parses `cpu`, `npu` (= `npu:0`), `npu:N` or `meta`, the spelling of `--device`.
    pub fn parse(s: &str) -> Option<Device> {
        match s {
            "cpu" => Some(Device::Cpu),
            "meta" => Some(Device::Meta),
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
            Device::Meta => write!(f, "meta"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_round_trips_display() {
        for d in [Device::Cpu, Device::Npu(0), Device::Npu(7), Device::Meta] {
            assert_eq!(Device::parse(&d.to_string()), Some(d));
        }
        assert_eq!(Device::parse("npu"), Some(Device::Npu(0)));
        assert_eq!(Device::parse("gpu"), None);
        assert_eq!(Device::parse("npu:x"), None);
    }
}
