//! [`HostTensor`]: values held in a host pool, with their shape, and the device buffer they
//! came from until its copy is known to be done.

use crate::buffer::DeviceBuffer;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::stream::Event;

#[cfg(feature = "npu")]
use crate::npu::PinnedHostBuffer;
#[cfg(feature = "npu")]
use std::sync::{Mutex, MutexGuard};

/// Values offloaded to a [`HostPool`](super::HostPool): their host copy, and the device
/// buffer until the copy is known to be done.
#[derive(Debug)]
pub struct HostTensor<T: Element> {
    pub(super) shape: Vec<usize>,
    /// The host copy in the pool's allocator (CPU backend; None on an NPU, where the copy is
    /// pinned and outside the pool's figures).
    pub(super) host: Option<DeviceBuffer<T>>,
    #[cfg(feature = "npu")]
    pub(super) pinned: Option<Mutex<PinnedHostBuffer<T>>>,
    /// The device buffer and the event its copy ends at (NPU), until [`HostTensor::settle`].
    pub(super) device: Option<(DeviceBuffer<T>, Option<Event>)>,
}

impl<T: Element> HostTensor<T> {
    /// A host tensor of shape `[0]` with no values anywhere: a placeholder for a moment
    /// (while a value is moved out from behind a `&mut`), never read.
    pub fn vacant() -> Self {
        HostTensor {
            shape: vec![0],
            host: None,
            #[cfg(feature = "npu")]
            pinned: None,
            device: None,
        }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Waits for the copy to the host and frees the device buffer.
    pub fn settle(&mut self) -> Result<()> {
        if let Some((_, Some(done))) = &self.device {
            done.synchronize()?;
        }
        self.device = None;
        Ok(())
    }

    /// Whether the device buffer is still held.
    pub fn on_device(&self) -> bool {
        self.device.is_some()
    }

    /// Number of values.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The host values of the pool's (CPU backend) copy.
    pub(super) fn host_values(&self, op: &'static str) -> Result<&[T]> {
        let host = self.host.as_ref().ok_or_else(|| no_copy(op))?;
        host.as_host_slice()
    }

    /// A copy of the values (after the copy into the host, if one is still in flight).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        #[cfg(feature = "npu")]
        if let Some(pinned) = &self.pinned {
            return Ok(lock(pinned, "HostTensor::to_vec")?.as_slice()?.to_vec());
        }
        // A meta pool's tensor has no values: it reads back as zeros, as a meta buffer does.
        if let Some(h) = self.host.as_ref().filter(|h| h.device().is_meta()) {
            return Ok(vec![T::zeroed(); h.len()]);
        }
        Ok(self.host_values("HostTensor::to_vec")?.to_vec())
    }

    /// Overwrites the values from `offset` on with `values` (in range).
    pub fn write_at(&mut self, offset: usize, values: &[T]) -> Result<()> {
        let n = self.numel();
        if offset.checked_add(values.len()).is_none_or(|end| end > n) {
            return Err(Error::InvalidArgument {
                what: "HostTensor::write_at",
                detail: format!(
                    "{} values at offset {offset} of a host tensor of {n}",
                    values.len()
                ),
            });
        }
        self.settle()?;
        let end = offset + values.len();
        #[cfg(feature = "npu")]
        if let Some(pinned) = self.pinned.as_mut() {
            let p = pinned
                .get_mut()
                .map_err(|_| poisoned("HostTensor::write_at"))?;
            p.as_mut_slice()?[offset..end].copy_from_slice(values);
            return Ok(());
        }
        let host = self
            .host
            .as_mut()
            .ok_or_else(|| no_copy("HostTensor::write_at"))?;
        host.as_host_slice_mut()?[offset..end].copy_from_slice(values);
        Ok(())
    }

    /// A copy in the same place (the pool's allocator, or new pinned memory).
    pub fn try_clone(&self) -> Result<Self> {
        #[cfg(feature = "npu")]
        if let Some(pinned) = &self.pinned {
            let p = lock(pinned, "HostTensor::try_clone")?;
            let copy = PinnedHostBuffer::from_slice(p.ordinal(), p.as_slice()?)?;
            return Ok(HostTensor {
                shape: self.shape.clone(),
                host: None,
                pinned: Some(Mutex::new(copy)),
                device: None,
            });
        }
        let src = self
            .host
            .as_ref()
            .ok_or_else(|| no_copy("HostTensor::try_clone"))?;
        let mut host = DeviceBuffer::alloc_in(src.allocator(), src.len())?;
        host.as_host_slice_mut()?
            .copy_from_slice(src.as_host_slice()?);
        Ok(HostTensor {
            shape: self.shape.clone(),
            host: Some(host),
            #[cfg(feature = "npu")]
            pinned: None,
            device: None,
        })
    }
}

pub(super) fn no_copy(op: &'static str) -> Error {
    Error::InvalidArgument {
        what: op,
        detail: "a host tensor with neither a pool block nor a pinned copy".into(),
    }
}

#[cfg(feature = "npu")]
pub(super) fn poisoned(op: &'static str) -> Error {
    Error::InvalidArgument {
        what: op,
        detail: "a pinned host copy was poisoned by a panic".into(),
    }
}

#[cfg(feature = "npu")]
pub(super) fn lock<'a, T: Element>(
    m: &'a Mutex<PinnedHostBuffer<T>>,
    op: &'static str,
) -> Result<MutexGuard<'a, PinnedHostBuffer<T>>> {
    m.lock().map_err(|_| poisoned(op))
}
