//! Host memory for what a step keeps off the device: offloaded activations
//! (`train.offload_activations`, [`super::saved`]) and offloaded optimizer state
//! (`train.offload_optimizer`, [`super::optim`]: the f32 master weights and AdamW's moments,
//! held across steps as [`Stored::Host`]).
//!
//! A [`HostPool`] is a second [`CachingAllocator`] on the host, separate from the device's:
//! the bytes that leave the device are counted there (its `max_allocated` is the host side's
//! peak), and the device allocator's figures fall by as much.
//!
//! ```text
//! offload(t)   host copy queued, the device tensor kept until settle()   [device -> host]
//! settle()     waits for that copy, frees the device tensor
//! reload(h)    a new device tensor, its copy queued                      [host -> device]
//! mark(), wait()  later work on the compute stream waits for the reloads queued so far
//! ```
//!
//! On the CPU backend the "device" is the host too: a copy is a memcpy between the two
//! allocators' blocks, done when the call returns. On an NPU the host copies are pinned
//! (`aclrtMallocHost`, `cannon_runtime::npu::PinnedHostBuffer`) and both directions run on
//! a second stream: it waits for an event of the compute stream before it reads or writes
//! (so it never reads a tensor before the kernels that write it have run, nor writes a block
//! the compute stream may still read), and the compute stream waits for its event before the
//! reloaded tensors are used, so the copies overlap the layers computed meanwhile. The
//! device tensor of an offload is freed only in `settle`, after its copy finished; the
//! callers settle one layer later on both backends, so the figures are the same.
//!
//! What stays in the pool across steps (the optimizer offload) is a settled [`HostTensor`]
//! (no device tensor) read and written in place: [`HostPool::reload_into`] copies it into a
//! device buffer the caller owns (an FSDP rank's staging buffer), [`HostPool::store_into`]
//! copies a device result back (synchronously: the update's p, m, v), and
//! [`HostTensor::to_vec`] / [`HostTensor::write_at`] are the host's own reads and writes
//! (checkpoints).
//!
//! For the meta device the pool's allocator is a meta one too: host tensors are counted as
//! real ones are, and no copy moves anything (a meta run measures the host side as well).

use cannon_kernels::{KernelError, Tensor};
use cannon_runtime::{
    BufferView, BufferViewMut, CachingAllocator, Device, Element, MemoryStats, Stream,
};
use std::sync::Arc;

type Result<T> = std::result::Result<T, KernelError>;

/// The host side of offloading for one device (see the module docs).
#[derive(Debug)]
pub struct HostPool {
    /// Host blocks (and, on the CPU backend, the offloaded tensors themselves).
    alloc: Arc<CachingAllocator>,
    /// The device whose tensors this pool holds.
    device: Device,
    /// The copy stream of an NPU device (None on the CPU).
    #[cfg(feature = "npu")]
    copy: Option<Stream>,
}

impl HostPool {
    /// A pool for tensors of `device`.
    pub fn new(device: Device) -> Result<Self> {
        #[cfg(feature = "npu")]
        let copy = match device {
            Device::Cpu | Device::Meta => None,
            Device::Npu(_) => Some(Stream::new(device)?),
        };
        #[cfg(not(feature = "npu"))]
        if let Device::Npu(_) = device {
            return Err(KernelError::Runtime(cannon_runtime::Error::NotCompiled {
                what: "HostPool::new",
                device,
            }));
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

    /// The device whose tensors this pool holds.
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

    /// Queues the copy of `t` (written by work queued on `st`) to the host; `t` stays alive
    /// in the result until [`HostTensor::settle`].
    pub fn offload<T: Element>(&self, st: &Stream, t: Tensor<T>) -> Result<HostTensor<T>> {
        #[cfg(feature = "npu")]
        if let (Some(copy), Device::Npu(ordinal)) = (&self.copy, t.device()) {
            use cannon_runtime::npu::PinnedHostBuffer;
            let mut pinned = PinnedHostBuffer::new(ordinal, t.numel())?;
            copy.wait(&st.record()?)?;
            t.view().memcpy_dtoh_async(copy, &mut pinned)?;
            let done = copy.record()?;
            return Ok(HostTensor {
                shape: t.shape().to_vec(),
                host: None,
                pinned: Some(std::sync::Mutex::new(pinned)),
                device: Some((t, Some(done))),
            });
        }
        let mut host = Tensor::empty_in(&self.alloc, t.shape())?;
        if !self.device.is_meta() {
            t.view()
                .memcpy_dtoh(st, host.buffer_mut().as_host_slice_mut()?)?;
        }
        Ok(HostTensor {
            shape: t.shape().to_vec(),
            host: Some(host),
            #[cfg(feature = "npu")]
            pinned: None,
            device: Some((t, None)),
        })
    }

    /// A device tensor (from `device`'s allocator) of `h`'s values, its copy queued; call
    /// [`HostPool::mark`] and [`HostPool::wait`] on the compute stream before it is read.
    pub fn reload<T: Element>(
        &self,
        device: &Arc<CachingAllocator>,
        st: &Stream,
        h: &HostTensor<T>,
    ) -> Result<Tensor<T>> {
        let mut t = Tensor::empty_in(device, &h.shape)?;
        self.reload_into(st, h, &mut t.view_mut())?;
        Ok(t)
    }

    /// Queues the copy of `h`'s values into `dst` (a device view of `h`'s length), as
    /// [`HostPool::reload`] does into a new tensor: mark and wait before `dst` is read.
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
            return Ok(dst.memcpy_htod_async(copy, &mut p)?);
        }
        if self.device.is_meta() {
            return Ok(());
        }
        Ok(dst.memcpy_htod(st, h.host_values("HostPool::reload")?)?)
    }

    /// Copies the device values `src` (`h`'s length, written by work queued on `st`) into
    /// `h`, and returns once they are there (the optimizer update's write-back: the next
    /// group's update may reuse `src`'s block at once).
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
            return Ok(src.memcpy_dtoh(st, p.as_mut_slice()?)?);
        }
        let host = h
            .host
            .as_mut()
            .ok_or_else(|| no_copy("HostPool::store_into"))?;
        if self.device.is_meta() {
            return Ok(());
        }
        Ok(src.memcpy_dtoh(st, host.buffer_mut().as_host_slice_mut()?)?)
    }

    /// The device tensor `t` (written by work queued on `st`) moved into the pool for good:
    /// its copy done and the device tensor freed when this returns.
    pub fn keep<T: Element>(&self, st: &Stream, t: Tensor<T>) -> Result<HostTensor<T>> {
        let mut h = self.offload(st, t)?;
        h.settle()?;
        Ok(h)
    }

    /// A host tensor of `values` (shape `[len]`) made on the host, never on the device (an
    /// FSDP rank's offloaded shards).
    pub fn from_values<T: Element>(&self, values: &[T]) -> Result<HostTensor<T>> {
        let shape = vec![values.len()];
        #[cfg(feature = "npu")]
        if let (Some(_), Device::Npu(ordinal)) = (&self.copy, self.device) {
            use cannon_runtime::npu::PinnedHostBuffer;
            let pinned = PinnedHostBuffer::from_slice(ordinal, values)?;
            return Ok(HostTensor {
                shape,
                host: None,
                pinned: Some(std::sync::Mutex::new(pinned)),
                device: None,
            });
        }
        let mut host = Tensor::empty_in(&self.alloc, &shape)?;
        if !self.device.is_meta() {
            host.buffer_mut()
                .as_host_slice_mut()?
                .copy_from_slice(values);
        }
        Ok(HostTensor {
            shape,
            host: Some(host),
            #[cfg(feature = "npu")]
            pinned: None,
            device: None,
        })
    }

    /// Staging slots an FSDP rank keeps for this pool (see `fsdp::schedule`): 2 where copies
    /// run on their own stream (the NPU: the next host shard's copy overlaps compute while
    /// the current one is all-gathered from the other slot), 1 on the CPU, whose copies are
    /// synchronous memcpys with nothing to overlap.
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
pub struct CopyMark(Option<cannon_runtime::Event>);

/// A tensor offloaded to a [`HostPool`]: its host copy, and the device tensor until the copy
/// is known to be done.
#[derive(Debug)]
pub struct HostTensor<T: Element> {
    shape: Vec<usize>,
    /// The host copy in the pool's allocator (CPU backend; None on an NPU, where the copy is
    /// pinned and outside the pool's figures).
    host: Option<Tensor<T>>,
    #[cfg(feature = "npu")]
    pinned: Option<std::sync::Mutex<cannon_runtime::npu::PinnedHostBuffer<T>>>,
    /// The device tensor and the event its copy ends at (NPU), until [`HostTensor::settle`].
    device: Option<(Tensor<T>, Option<cannon_runtime::Event>)>,
}

impl<T: Element> HostTensor<T> {
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Waits for the copy to the host and frees the device tensor.
    pub fn settle(&mut self) -> Result<()> {
        if let Some((_, Some(done))) = &self.device {
            done.synchronize()?;
        }
        self.device = None;
        Ok(())
    }

    /// Whether the device tensor is still held.
    pub fn on_device(&self) -> bool {
        self.device.is_some()
    }

    /// Number of values.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The host values of the pool's (CPU backend) copy.
    fn host_values(&self, op: &'static str) -> Result<&[T]> {
        let host = self.host.as_ref().ok_or_else(|| no_copy(op))?;
        Ok(host.buffer().as_host_slice()?)
    }

    /// A copy of the values (after the copy into the host, if one is still in flight).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        #[cfg(feature = "npu")]
        if let Some(pinned) = &self.pinned {
            return Ok(lock(pinned, "HostTensor::to_vec")?.as_slice()?.to_vec());
        }
        // A meta pool's tensor has no values: it reads back as zeros, as a meta buffer does.
        if let Some(h) = self.host.as_ref().filter(|h| h.buffer().device().is_meta()) {
            return Ok(vec![T::zeroed(); h.numel()]);
        }
        Ok(self.host_values("HostTensor::to_vec")?.to_vec())
    }

    /// Overwrites the values from `offset` on with `values` (in range).
    pub fn write_at(&mut self, offset: usize, values: &[T]) -> Result<()> {
        let n = self.numel();
        if offset.checked_add(values.len()).is_none_or(|end| end > n) {
            return Err(KernelError::InvalidArgument {
                op: "HostTensor::write_at",
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
        host.buffer_mut().as_host_slice_mut()?[offset..end].copy_from_slice(values);
        Ok(())
    }

    /// A copy in the same place (the pool's allocator, or new pinned memory).
    pub fn try_clone(&self) -> Result<Self> {
        #[cfg(feature = "npu")]
        if let Some(pinned) = &self.pinned {
            let p = lock(pinned, "HostTensor::try_clone")?;
            let copy =
                cannon_runtime::npu::PinnedHostBuffer::from_slice(p.ordinal(), p.as_slice()?)?;
            return Ok(HostTensor {
                shape: self.shape.clone(),
                host: None,
                pinned: Some(std::sync::Mutex::new(copy)),
                device: None,
            });
        }
        let src = self
            .host
            .as_ref()
            .ok_or_else(|| no_copy("HostTensor::try_clone"))?;
        let mut host = Tensor::empty_in(src.buffer().allocator(), &self.shape)?;
        host.buffer_mut()
            .as_host_slice_mut()?
            .copy_from_slice(src.buffer().as_host_slice()?);
        Ok(HostTensor {
            shape: self.shape.clone(),
            host: Some(host),
            #[cfg(feature = "npu")]
            pinned: None,
            device: None,
        })
    }
}

fn no_copy(op: &'static str) -> KernelError {
    KernelError::InvalidArgument {
        op,
        detail: "a host tensor with neither a pool block nor a pinned copy".into(),
    }
}

#[cfg(feature = "npu")]
fn poisoned(op: &'static str) -> KernelError {
    KernelError::InvalidArgument {
        op,
        detail: "a pinned host copy was poisoned by a panic".into(),
    }
}

#[cfg(feature = "npu")]
fn lock<'a, T: Element>(
    m: &'a std::sync::Mutex<cannon_runtime::npu::PinnedHostBuffer<T>>,
    op: &'static str,
) -> Result<std::sync::MutexGuard<'a, cannon_runtime::npu::PinnedHostBuffer<T>>> {
    m.lock().map_err(|_| poisoned(op))
}

/// A tensor held across steps (one group's f32 master weights, or one of its AdamW
/// moments): on the model's device, or (`train.offload_optimizer`) in the exec's host pool,
/// where no kernel reads it: a pass fetches a copy ([`super::source`]) and the optimizer
/// streams it through the device ([`super::optim::adamw_group`]).
#[derive(Debug)]
pub enum Stored {
    Device(Tensor<f32>),
    /// Boxed: the host side (with its pinned copy and events on an NPU) is larger than a
    /// device tensor.
    Host(Box<HostTensor<f32>>),
}

impl Stored {
    pub fn numel(&self) -> usize {
        match self {
            Stored::Device(t) => t.numel(),
            Stored::Host(h) => h.numel(),
        }
    }

    /// Whether the values are in a host pool.
    pub fn is_host(&self) -> bool {
        matches!(self, Stored::Host(_))
    }

    /// The device tensor (None when the values are in a host pool).
    pub fn device_tensor(&self) -> Option<&Tensor<f32>> {
        match self {
            Stored::Device(t) => Some(t),
            Stored::Host(_) => None,
        }
    }

    /// The device tensor, mutably (None when the values are in a host pool).
    pub fn device_tensor_mut(&mut self) -> Option<&mut Tensor<f32>> {
        match self {
            Stored::Device(t) => Some(t),
            Stored::Host(_) => None,
        }
    }

    /// A host copy of the values (`st`: the device tensor's stream).
    pub fn to_host(&self, st: &Stream) -> Result<Vec<f32>> {
        match self {
            Stored::Device(t) => t.to_host(st),
            Stored::Host(h) => h.to_vec(),
        }
    }

    /// Overwrites the values from `offset` on with host `values`.
    pub fn write_at(&mut self, st: &Stream, offset: usize, values: &[f32]) -> Result<()> {
        match self {
            Stored::Device(t) => {
                let range = offset..offset.saturating_add(values.len());
                Ok(t.buffer_mut().slice_mut(range)?.memcpy_htod(st, values)?)
            }
            Stored::Host(h) => h.write_at(offset, values),
        }
    }

    /// Overwrites every value with host `values` (of the same length).
    pub fn write(&mut self, st: &Stream, values: &[f32]) -> Result<()> {
        let n = self.numel();
        if values.len() != n {
            return Err(KernelError::InvalidArgument {
                op: "Stored::write",
                detail: format!("{} values for a tensor of {n}", values.len()),
            });
        }
        self.write_at(st, 0, values)
    }

    /// A copy in the same place.
    pub fn try_clone(&self, st: &Stream) -> Result<Self> {
        Ok(match self {
            Stored::Device(t) => Stored::Device(t.try_clone(st)?),
            Stored::Host(h) => Stored::Host(Box::new(h.try_clone()?)),
        })
    }

    /// Moves the values into `pool` (nothing to do when they are there already); the device
    /// tensor is freed when this returns.
    pub fn offload(&mut self, pool: &HostPool, st: &Stream) -> Result<()> {
        if self.is_host() {
            return Ok(());
        }
        let placeholder = Stored::Host(Box::new(HostTensor {
            shape: vec![0],
            host: None,
            #[cfg(feature = "npu")]
            pinned: None,
            device: None,
        }));
        if let Stored::Device(t) = std::mem::replace(self, placeholder) {
            *self = Stored::Host(Box::new(pool.keep(st, t)?));
        }
        Ok(())
    }
}
