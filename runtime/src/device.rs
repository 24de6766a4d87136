//! Devices: the host CPU and Ascend NPUs by ordinal.

use std::fmt;

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
