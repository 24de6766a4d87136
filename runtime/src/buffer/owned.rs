//! The owned buffer: its allocation, its accessors, host borrows and its return to the cache.

use crate::alloc::{Block, CachingAllocator};
use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::stream::Stream;
use std::marker::PhantomData;
use std::sync::Arc;

/// An owned allocation of `len` values of `T` on one device, returned to its allocator's
/// cache on drop.
pub struct DeviceBuffer<T: Element> {
    pub(super) block: Block,
    len: usize,
    pub(super) alloc: Arc<CachingAllocator>,
    _t: PhantomData<T>,
}

impl<T: Element> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer<{}>[{}] on {}",
            std::any::type_name::<T>(),
            self.len,
            self.device()
        )
    }
}

fn byte_len<T>(what: &'static str, len: usize) -> Result<usize> {
    len.checked_mul(std::mem::size_of::<T>())
        .ok_or(Error::SizeOverflow {
            what,
            len,
            elem: std::mem::size_of::<T>(),
        })
}

impl<T: Element> DeviceBuffer<T> {
    /// `len` values on the stream's device from its default allocator, for work on `stream`:
    /// the block is reused on another stream only after the work queued here before its
    /// drop has finished (see [`crate::alloc`]). Contents are unspecified (initialised
    /// memory, possibly a previous user's values).
    pub fn alloc(stream: &Stream, len: usize) -> Result<Self> {
        let alloc = stream.device().allocator()?;
        Self::alloc_on(&alloc, stream, len)
    }

    /// `len` values from a given allocator (its device decides where they live) for work on
    /// `stream`, which must be on that device; reuse across streams as in [`Self::alloc`].
    pub fn alloc_on(alloc: &Arc<CachingAllocator>, stream: &Stream, len: usize) -> Result<Self> {
        Self::alloc_impl(alloc, Some(stream), len)
    }

    /// `len` values from a given allocator, for no stream in particular: on an NPU the caller
    /// orders every use (one stream, or synchronising between streams), because the block
    /// may be handed to the next request without a stream as soon as it is dropped. Prefer
    /// [`Self::alloc_on`] for memory used by queued work.
    pub fn alloc_in(alloc: &Arc<CachingAllocator>, len: usize) -> Result<Self> {
        Self::alloc_impl(alloc, None, len)
    }

    fn alloc_impl(
        alloc: &Arc<CachingAllocator>,
        stream: Option<&Stream>,
        len: usize,
    ) -> Result<Self> {
        Self::obtain(alloc, stream, len).map(|(b, _)| b)
    }

    /// A buffer, and whether its block was obtained anew (not from the cache).
    pub(super) fn obtain(
        alloc: &Arc<CachingAllocator>,
        stream: Option<&Stream>,
        len: usize,
    ) -> Result<(Self, bool)> {
        if std::mem::align_of::<T>() > crate::alloc::BLOCK_ALIGN {
            return Err(Error::Alignment {
                what: "DeviceBuffer::alloc",
                offset: 0,
                bytes: 0,
                align: std::mem::align_of::<T>(),
            });
        }
        let bytes = byte_len::<T>("DeviceBuffer::alloc", len)?;
        let (block, fresh) = alloc.allocate(bytes, stream)?;
        let buf = DeviceBuffer {
            block,
            len,
            alloc: alloc.clone(),
            _t: PhantomData,
        };
        Ok((buf, fresh))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn device(&self) -> Device {
        self.alloc.device()
    }

    /// The element type, `T::DTYPE`.
    pub fn dtype(&self) -> DType {
        T::DTYPE
    }

    /// Bytes the buffer's values occupy (the block may be larger: see [`crate::alloc`]).
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// Marks the buffer as used by work queued on `stream` (torch's `record_stream`): when the
    /// buffer is dropped, its block waits for that work before serving another stream. Needed
    /// only for streams other than the one the buffer was allocated for; a no-op on the CPU.
    pub fn record_stream(&self, stream: &Stream) -> Result<()> {
        self.block.record_stream(self.device(), stream)
    }

    /// The allocator this buffer returns to.
    pub fn allocator(&self) -> &Arc<CachingAllocator> {
        &self.alloc
    }

    /// Borrows the values directly; only host (CPU) buffers allow this.
    pub fn as_host_slice(&self) -> Result<&[T]> {
        self.host_range("as_host_slice", 0, self.len)
    }

    /// Borrows the values mutably; only host (CPU) buffers allow this.
    pub fn as_host_slice_mut(&mut self) -> Result<&mut [T]> {
        self.host_range_mut("as_host_slice_mut", 0, self.len)
    }

    /// The device address of the first value (for FFI calls on NPU buffers).
    pub fn as_raw_ptr(&self) -> *const T {
        self.block.ptr as *const T
    }

    /// The device address of the first value, for FFI calls that write.
    pub fn as_raw_mut_ptr(&mut self) -> *mut T {
        self.block.ptr as *mut T
    }

    pub(super) fn host_range(&self, what: &'static str, start: usize, len: usize) -> Result<&[T]> {
        if !self.device().is_cpu() {
            return Err(Error::NotHostAccessible {
                what,
                device: self.device(),
            });
        }
        if len == 0 {
            return Ok(&[]);
        }
        // SAFETY: host blocks are at least len * size_of::<T>() bytes, aligned to 64 (>=
        // align_of::<T>(), checked at allocation), zero-initialised when obtained and only
        // ever written with values of Pod types, so every bit pattern read is a valid T. The
        // shared borrow of self prevents concurrent mutation through this buffer.
        Ok(unsafe { std::slice::from_raw_parts((self.block.ptr as *const T).add(start), len) })
    }

    pub(super) fn host_range_mut(
        &mut self,
        what: &'static str,
        start: usize,
        len: usize,
    ) -> Result<&mut [T]> {
        if !self.device().is_cpu() {
            return Err(Error::NotHostAccessible {
                what,
                device: self.device(),
            });
        }
        if len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: as in host_range; the exclusive borrow of self makes this the only access.
        Ok(unsafe { std::slice::from_raw_parts_mut((self.block.ptr as *mut T).add(start), len) })
    }
}

impl<T: Element> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        let block = std::mem::replace(&mut self.block, Block::empty());
        self.alloc.free(block);
    }
}
