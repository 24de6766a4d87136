//! Buffers born with contents: zeros (directly, or through the [`Pending`] hand-over that
//! lets another thread write the pages), or a copy of host values.

use super::owned::DeviceBuffer;
use crate::alloc::CachingAllocator;
use crate::dtype::Element;
use crate::error::Result;
use crate::stream::Stream;
use std::sync::Arc;

impl<T: Element> DeviceBuffer<T> {
    /// `len` zeros on the stream's device.
    pub fn alloc_zeros(stream: &Stream, len: usize) -> Result<Self> {
        let alloc = stream.device().allocator()?;
        Self::alloc_zeros_on(&alloc, stream, len)
    }

    /// `len` zeros from a given allocator for work on `stream` (reuse as in
    /// [`Self::alloc_on`]); see [`Pending::zero`] for how they are written.
    pub fn alloc_zeros_on(
        alloc: &Arc<CachingAllocator>,
        stream: &Stream,
        len: usize,
    ) -> Result<Self> {
        Self::alloc_pending(alloc, stream, len)?.zero(stream)
    }

    /// `len` values from a given allocator for work on `stream`, made ready by
    /// [`Pending::zero`] or [`Pending::prefault`] before any use: the allocation here (on
    /// the thread whose memory figures it belongs to), the writing of the pages wherever the
    /// caller likes (another thread, while this one reads a model's weights).
    pub fn alloc_pending(
        alloc: &Arc<CachingAllocator>,
        stream: &Stream,
        len: usize,
    ) -> Result<Pending<T>> {
        let (buf, fresh) = Self::obtain(alloc, Some(stream), len)?;
        Ok(Pending { buf, fresh })
    }

    /// `len` zeros from a given allocator.
    pub fn alloc_zeros_in(alloc: &Arc<CachingAllocator>, len: usize) -> Result<Self> {
        let (mut b, fresh) = Self::obtain(alloc, None, len)?;
        if fresh && b.alloc.prefault_zeroed(&b.block) {
            return Ok(b);
        }
        let stream = Stream::new(b.device())?;
        b.memset_zeros(&stream)?;
        // The stream is private to this call: the zeros must be in place before the buffer
        // is used on any other stream (on the CPU this returns at once).
        stream.synchronize()?;
        Ok(b)
    }

    /// A new buffer on the stream's device holding a copy of `src`.
    pub fn clone_htod(stream: &Stream, src: &[T]) -> Result<Self> {
        let mut b = Self::alloc(stream, src.len())?;
        b.memcpy_htod(stream, src)?;
        Ok(b)
    }
}

/// A buffer allocated and not yet handed over ([`DeviceBuffer::alloc_pending`]): its values
/// cannot be reached until [`Pending::zero`] or [`Pending::prefault`] hands it over. Neither
/// allocates, so they run on any thread without moving memory figures between threads.
#[derive(Debug)]
pub struct Pending<T: Element> {
    buf: DeviceBuffer<T>,
    /// The block was obtained anew, and nothing has written it since.
    fresh: bool,
}

impl<T: Element> Pending<T> {
    /// Writes zeros and hands the buffer over. A block the host mapped anew is made resident
    /// by the kernel, which zeroes its pages as it does on a first touch, and is not written
    /// again (`alloc::host`: half the bytes written of faulting the pages in by a `memset`);
    /// any other block is zeroed on `stream`.
    pub fn zero(self, stream: &Stream) -> Result<DeviceBuffer<T>> {
        let Pending { mut buf, fresh } = self;
        if !(fresh && buf.alloc.prefault_zeroed(&buf.block)) {
            buf.memset_zeros(stream)?;
        }
        Ok(buf)
    }

    /// Hands the buffer over with its contents unspecified (as [`DeviceBuffer::alloc_on`]
    /// does), a block the host mapped anew made resident first: for a buffer about to be
    /// overwritten, so that the kernel's zeroing of its pages on their first touch is done
    /// here rather than by the thread that writes it. Any other block is left as it is.
    pub fn prefault(self) -> DeviceBuffer<T> {
        let Pending { buf, fresh } = self;
        if fresh {
            let _ = buf.alloc.prefault_zeroed(&buf.block);
        }
        buf
    }
}
