//! Devices: the host CPU, Ascend NPUs by ordinal and the meta device.
//!
//! [`Device`] is a plain value at the bottom of the crate (errors name it, so it imports
//! nothing of the crate). What a device has at run time, its process-wide caching allocator
//! and the NPU count, is in the child module `backends`, which sits above both the allocator
//! and `crate::npu`: it is where the allocator (which knows only host memory and the
//! `RawMemory` trait) meets the backends' device memory (`crate::npu` implements
//! `RawMemory`), so neither of the two depends on the other.

mod backends;

use std::fmt;

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
