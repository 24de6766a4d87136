//! Where a model's work runs and where its memory comes from: one stream, the caching
//! allocator its tensors are taken from, and optionally a host pool for what it offloads.
//!
//! By default that is the device's process-wide allocator
//! ([`Device::allocator`]), so the figures a step reports are the device's. A
//! trainer (or a test) that wants the model's own figures, untouched by other work in the
//! process, gives it a private allocator with [`DeviceCtx::with_allocator`].

use crate::error::KernelError;
use crate::tensor::Tensor;
use cannon_runtime::{CachingAllocator, Device, HostPool, MemoryStats, Stream};
use std::sync::Arc;

/// A stream and the allocator the model's tensors come from (same device).
#[derive(Clone, Debug)]
pub struct DeviceCtx {
    stream: Arc<Stream>,
    alloc: Arc<CachingAllocator>,
    /// Where offloaded activations and optimizer state go (None: nothing is offloaded).
    host: Option<Arc<HostPool>>,
}

impl DeviceCtx {
    /// The host, with the process-wide CPU allocator.
    pub fn cpu() -> Self {
        let alloc = Device::Cpu
            .allocator()
            .unwrap_or_else(|_| CachingAllocator::new_cpu());
        DeviceCtx {
            stream: Arc::new(Stream::cpu()),
            alloc,
            host: None,
        }
    }

    /// A new stream on `device` with the device's allocator.
    pub fn new(device: Device) -> Result<Self, KernelError> {
        Ok(DeviceCtx {
            stream: Arc::new(Stream::new(device)?),
            alloc: device.allocator()?,
            host: None,
        })
    }

    /// A stream with a given allocator; both must be on the same device.
    pub fn with_allocator(
        stream: Arc<Stream>,
        alloc: Arc<CachingAllocator>,
    ) -> Result<Self, KernelError> {
        if stream.device() != alloc.device() {
            return Err(KernelError::Runtime(
                cannon_runtime::Error::DeviceMismatch {
                    what: "DeviceCtx::with_allocator",
                    expected: stream.device(),
                    found: alloc.device(),
                },
            ));
        }
        Ok(DeviceCtx {
            stream,
            alloc,
            host: None,
        })
    }

    /// The same stream with an allocator of its own, whose blocks are in no one else's figures
    /// or cache (measurements beside a model: the GEMM peak at start-up).
    pub fn with_private_allocator(&self) -> Result<Self, KernelError> {
        let alloc = self.device().private_allocator()?;
        DeviceCtx::with_allocator(self.stream.clone(), alloc)
    }

    /// The same stream and allocator with a fresh [`HostPool`] for offloading (the memory
    /// features `train.offload_activations` and `train.offload_optimizer`).
    pub fn with_host_pool(mut self) -> Result<Self, KernelError> {
        self.host = Some(Arc::new(HostPool::new(self.device())?));
        Ok(self)
    }

    /// The host pool, if this exec has one.
    pub fn host_pool(&self) -> Option<&Arc<HostPool>> {
        self.host.as_ref()
    }

    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    pub fn allocator(&self) -> &Arc<CachingAllocator> {
        &self.alloc
    }

    pub fn device(&self) -> Device {
        self.stream.device()
    }

    /// The allocator's figures now.
    pub fn memory(&self) -> MemoryStats {
        self.alloc.stats()
    }

    /// A tensor whose contents are unspecified (for outputs an op overwrites).
    pub fn empty<T: cannon_runtime::Element>(
        &self,
        shape: &[usize],
    ) -> Result<Tensor<T>, KernelError> {
        Tensor::empty_on(&self.alloc, &self.stream, shape)
    }

    /// A tensor of zeros (for outputs an op accumulates into).
    pub fn zeros<T: cannon_runtime::Element>(
        &self,
        shape: &[usize],
    ) -> Result<Tensor<T>, KernelError> {
        Tensor::zeros_in(&self.alloc, &self.stream, shape)
    }

    /// A device copy of host data.
    pub fn upload<T: cannon_runtime::Element>(
        &self,
        data: &[T],
        shape: &[usize],
    ) -> Result<Tensor<T>, KernelError> {
        Tensor::from_host_in(&self.alloc, &self.stream, data, shape)
    }
}
