//! [`HostPool`]: the host side of offloading for one device (see the module docs of
//! [`crate::offload`]), and the [`CopyMark`]s that order later work after its copies.

use super::host_tensor::{no_copy, HostTensor};
use crate::alloc::{CachingAllocator, MemoryStats};
use crate::buffer::{BufferView, BufferViewMut, DeviceBuffer};
use crate::device::Device;
use crate::dtype::Element;
use crate::error::Result;
use crate::stream::{Event, Stream};
use std::sync::Arc;

#[cfg(feature = "npu")]
use super::host_tensor::{lock, poisoned};
#[cfg(feature = "npu")]
use crate::npu::PinnedHostBuffer;
#[cfg(feature = "npu")]
use std::sync::Mutex;

/// The host side of offloading for one device (see the module docs).
#[derive(Debug)]
pub struct HostPool {
    /// Host blocks (and, on the CPU backend, the offloaded values themselves).
    alloc: Arc<CachingAllocator>,
    /// The device whose buffers this pool holds.
    device: Device,
    /// The copy stream of an NPU device (None on the CPU).
    #[cfg(feature = "npu")]
    copy: Option<Stream>,
}

impl HostPool {
    /// A pool for buffers of `device`.
    pub fn new(device: Device) -> Result<Self> {
        #[cfg(feature = "npu")]
        let copy = match device {
            Device::Cpu | Device::Meta => None,
            Device::Npu(_) => Some(Stream::new(device)?),
        };
        #[cfg(not(feature = "npu"))]
        if let Device::Npu(_) = device {
            return Err(crate::error::Error::NotCompiled {
                what: "HostPool::new",
                device,
            });
        }
        let alloc = match device {
            Device::Meta => CachingAllocator::new_meta(),
            _ => CachingAllocator::new_cpu(),
        };
        Ok(HostPool {
            alloc,
            device,
            #[cfg(feature = "npu")]
            copy,
        })
    }

    /// The device whose buffers this pool holds.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The host allocator (whose figures are the host side's).
    pub fn allocator(&self) -> &Arc<CachingAllocator> {
        &self.alloc
    }

    /// The host allocator's figures (on the CPU backend; pinned NPU copies are not counted).
    pub fn stats(&self) -> MemoryStats {
        self.alloc.stats()
    }

    /// Queues the copy of `buf` (written by work queued on `st`; its values of `shape`) to the
    /// host; `buf` stays alive in the result until [`HostTensor::settle`].
    pub fn offload<T: Element>(
        &self,
        st: &Stream,
        buf: DeviceBuffer<T>,
        shape: &[usize],
    ) -> Result<HostTensor<T>> {
        #[cfg(feature = "npu")]
        if let (Some(copy), Device::Npu(ordinal)) = (&self.copy, buf.device()) {
            let mut pinned = PinnedHostBuffer::new(ordinal, buf.len())?;
            copy.wait(&st.record()?)?;
            buf.view().memcpy_dtoh_async(copy, &mut pinned)?;
            let done = copy.record()?;
            return Ok(HostTensor {
                shape: shape.to_vec(),
                host: None,
                pinned: Some(Mutex::new(pinned)),
                device: Some((buf, Some(done))),
            });
        }
        let mut host = DeviceBuffer::alloc_in(&self.alloc, buf.len())?;
        if !self.device.is_meta() {
            buf.view().memcpy_dtoh(st, host.as_host_slice_mut()?)?;
        }
        Ok(HostTensor {
            shape: shape.to_vec(),
            host: Some(host),
            #[cfg(feature = "npu")]
            pinned: None,
            device: Some((buf, None)),
        })
    }

    /// A device buffer (from `device`'s allocator) of `h`'s values, its copy queued; call
    /// [`HostPool::mark`] and [`HostPool::wait`] on the compute stream before it is read.
    pub fn reload<T: Element>(
        &self,
        device: &Arc<CachingAllocator>,
        st: &Stream,
        h: &HostTensor<T>,
    ) -> Result<DeviceBuffer<T>> {
        let mut b = DeviceBuffer::alloc_in(device, h.numel())?;
        self.reload_into(st, h, &mut b.view_mut())?;
        Ok(b)
    }

    /// Queues the copy of `h`'s values into `dst` (a device view of `h`'s length), as
    /// [`HostPool::reload`] does into a new buffer: mark and wait before `dst` is read.
    pub fn reload_into<T: Element>(
        &self,
        st: &Stream,
        h: &HostTensor<T>,
        dst: &mut BufferViewMut<'_, T>,
    ) -> Result<()> {
        #[cfg(feature = "npu")]
        if let (Some(copy), Some(pinned)) = (&self.copy, &h.pinned) {
            // The block may have been freed (or, a staging buffer, read) by work still queued
            // on `st`: write it only after that work.
            copy.wait(&st.record()?)?;
            let mut p = lock(pinned, "HostPool::reload")?;
            return dst.memcpy_htod_async(copy, &mut p);
        }
        if self.device.is_meta() {
            return Ok(());
        }
        dst.memcpy_htod(st, h.host_values("HostPool::reload")?)
    }

    /// Copies the device values `src` (`h`'s length, written by work queued on `st`) into
    /// `h`, and returns once they are there (an optimizer update's write-back: the next
    /// update may reuse `src`'s block at once).
    pub fn store_into<T: Element>(
        &self,
        st: &Stream,
        src: &BufferView<'_, T>,
        h: &mut HostTensor<T>,
    ) -> Result<()> {
        h.settle()?;
        #[cfg(feature = "npu")]
        if let Some(pinned) = h.pinned.as_mut() {
            let p = pinned
                .get_mut()
                .map_err(|_| poisoned("HostPool::store_into"))?;
            return src.memcpy_dtoh(st, p.as_mut_slice()?);
        }
        let host = h
            .host
            .as_mut()
            .ok_or_else(|| no_copy("HostPool::store_into"))?;
        if self.device.is_meta() {
            return Ok(());
        }
        src.memcpy_dtoh(st, host.as_host_slice_mut()?)
    }

    /// The device buffer `buf` (written by work queued on `st`) moved into the pool for good:
    /// its copy done and the device buffer freed when this returns.
    pub fn keep<T: Element>(
        &self,
        st: &Stream,
        buf: DeviceBuffer<T>,
        shape: &[usize],
    ) -> Result<HostTensor<T>> {
        let mut h = self.offload(st, buf, shape)?;
        h.settle()?;
        Ok(h)
    }

    /// A host tensor of `values` (shape `[len]`) made on the host, never on the device (an
    /// FSDP rank's offloaded shards).
    pub fn from_values<T: Element>(&self, values: &[T]) -> Result<HostTensor<T>> {
        let shape = vec![values.len()];
        #[cfg(feature = "npu")]
        if let (Some(_), Device::Npu(ordinal)) = (&self.copy, self.device) {
            let pinned = PinnedHostBuffer::from_slice(ordinal, values)?;
            return Ok(HostTensor {
                shape,
                host: None,
                pinned: Some(Mutex::new(pinned)),
                device: None,
            });
        }
        let mut host = DeviceBuffer::alloc_in(&self.alloc, values.len())?;
        if !self.device.is_meta() {
            host.as_host_slice_mut()?.copy_from_slice(values);
        }
        Ok(HostTensor {
            shape,
            host: Some(host),
            #[cfg(feature = "npu")]
            pinned: None,
            device: None,
        })
    }

    /// Staging slots an FSDP rank keeps for this pool: 2 where copies run on their own stream
    /// (the NPU: the next host shard's copy overlaps compute while the current one is
    /// all-gathered from the other slot), 1 on the CPU, whose copies are synchronous memcpys
    /// with nothing to overlap.
    /// The meta device plans as the NPU.
    pub fn staging_slots(device: Device) -> usize {
        match device {
            Device::Cpu => 1,
            Device::Npu(_) | Device::Meta => 2,
        }
    }

    /// A point after every copy queued so far (NPU: an event on the copy stream).
    pub fn mark(&self) -> Result<CopyMark> {
        #[cfg(feature = "npu")]
        if let Some(copy) = &self.copy {
            return Ok(CopyMark(Some(copy.record()?)));
        }
        Ok(CopyMark(None))
    }

    /// Makes later work on `st` wait for the copies queued before `m`.
    pub fn wait(&self, st: &Stream, m: &CopyMark) -> Result<()> {
        if let Some(e) = &m.0 {
            st.wait(e)?;
        }
        Ok(())
    }
}

/// A point on the copy stream: [`HostPool::mark`], [`HostPool::wait`].
#[derive(Debug)]
pub struct CopyMark(Option<Event>);
