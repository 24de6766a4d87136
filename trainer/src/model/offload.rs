//! Host memory for what a step keeps off the device: offloaded activations
//! (`train.offload_activations`, [`super::saved`]) and offloaded optimizer state
//! (`train.offload_optimizer`, [`super::optim`]).
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

use cannon_kernels::{KernelError, Tensor};
use cannon_runtime::{CachingAllocator, Device, Element, MemoryStats, Stream};
use std::sync::Arc;

type Result<T> = std::result::Result<T, KernelError>;

/// The host side of offloading for one device (see the module docs).
#[derive(Debug)]
pub struct HostPool {
    /// Host blocks (and, on the CPU backend, the offloaded tensors themselves).
    alloc: Arc<CachingAllocator>,
    /// The copy stream of an NPU device (None on the CPU).
    #[cfg(feature = "npu")]
    copy: Option<Stream>,
}

impl HostPool {
    /// A pool for tensors of `device`.
    pub fn new(device: Device) -> Result<Self> {
        #[cfg(feature = "npu")]
        let copy = match device {
            Device::Cpu => None,
            Device::Npu(_) => Some(Stream::new(device)?),
        };
        #[cfg(not(feature = "npu"))]
        if let Device::Npu(_) = device {
            return Err(KernelError::Runtime(cannon_runtime::Error::NotCompiled {
                what: "HostPool::new",
                device,
            }));
        }
        Ok(HostPool {
            alloc: CachingAllocator::new_cpu(),
            #[cfg(feature = "npu")]
            copy,
        })
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
        t.view()
            .memcpy_dtoh(st, host.buffer_mut().as_host_slice_mut()?)?;
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
        #[cfg(feature = "npu")]
        if let (Some(copy), Some(pinned)) = (&self.copy, &h.pinned) {
            // The new block may have been freed by work still queued on `st`: write it only
            // after that work.
            copy.wait(&st.record()?)?;
            let mut p = pinned.lock().map_err(|_| KernelError::InvalidArgument {
                op: "HostPool::reload",
                detail: "a pinned host copy was poisoned by a panic".into(),
            })?;
            t.view_mut().memcpy_htod_async(copy, &mut p)?;
            return Ok(t);
        }
        let host = h
            .host
            .as_ref()
            .ok_or_else(|| KernelError::InvalidArgument {
                op: "HostPool::reload",
                detail: "a host tensor with neither a pool block nor a pinned copy".into(),
            })?;
        t.view_mut()
            .memcpy_htod(st, host.buffer().as_host_slice()?)?;
        Ok(t)
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
}
