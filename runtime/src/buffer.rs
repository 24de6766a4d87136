//! `DeviceBuffer<T>`: an owned, typed, length-checked allocation on one device, and borrowed
//! views of sub-ranges.
//!
//! Rust analogies (cudarc's table): `DeviceBuffer<T>` ~ `Vec<T>`, `BufferView<'_, T>` ~ `&[T]`,
//! `BufferViewMut<'_, T>` ~ `&mut [T]`, [`Stream`] ~ a thread that runs work in order.
//! Copies are named by direction: `clone_htod` (allocate + copy in), `memcpy_htod` (into an
//! existing buffer), `clone_dtoh` / `memcpy_dtoh`, `memcpy_dtod`. On the CPU the buffer's
//! memory is host memory and `as_host_slice` borrows it directly.

use crate::alloc::{Block, CachingAllocator};
use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::stream::Stream;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

/// An owned allocation of `len` values of `T` on one device, returned to its allocator's
/// cache on drop.
pub struct DeviceBuffer<T: Element> {
    block: Block,
    len: usize,
    alloc: Arc<CachingAllocator>,
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
    fn obtain(
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

    pub fn view(&self) -> BufferView<'_, T> {
        BufferView {
            buf: self,
            start: 0,
            len: self.len,
        }
    }

    pub fn view_mut(&mut self) -> BufferViewMut<'_, T> {
        let len = self.len;
        BufferViewMut {
            buf: self,
            start: 0,
            len,
        }
    }

    /// A view of `range`, checked against the length.
    pub fn slice(&self, range: Range<usize>) -> Result<BufferView<'_, T>> {
        check_range("DeviceBuffer::slice", &range, self.len)?;
        Ok(BufferView {
            buf: self,
            start: range.start,
            len: range.len(),
        })
    }

    /// A mutable view of `range`, checked against the length.
    pub fn slice_mut(&mut self, range: Range<usize>) -> Result<BufferViewMut<'_, T>> {
        check_range("DeviceBuffer::slice_mut", &range, self.len)?;
        Ok(BufferViewMut {
            buf: self,
            start: range.start,
            len: range.len(),
        })
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

    /// Copies `src` into the buffer (lengths must match).
    pub fn memcpy_htod(&mut self, stream: &Stream, src: &[T]) -> Result<()> {
        self.view_mut().memcpy_htod(stream, src)
    }

    /// A host copy of the values.
    pub fn clone_dtoh(&self, stream: &Stream) -> Result<Vec<T>> {
        self.view().clone_dtoh(stream)
    }

    /// Copies the values into `dst` (lengths must match).
    pub fn memcpy_dtoh(&self, stream: &Stream, dst: &mut [T]) -> Result<()> {
        self.view().memcpy_dtoh(stream, dst)
    }

    /// Copies another buffer (or view) of the same device into this one.
    pub fn memcpy_dtod(&mut self, stream: &Stream, src: &BufferView<'_, T>) -> Result<()> {
        self.view_mut().memcpy_dtod(stream, src)
    }

    /// Sets every byte to zero.
    pub fn memset_zeros(&mut self, stream: &Stream) -> Result<()> {
        self.view_mut().memset_zeros(stream)
    }

    fn host_range(&self, what: &'static str, start: usize, len: usize) -> Result<&[T]> {
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

    fn host_range_mut(&mut self, what: &'static str, start: usize, len: usize) -> Result<&mut [T]> {
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

impl<T: Element> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        let block = std::mem::replace(&mut self.block, Block::empty());
        self.alloc.free(block);
    }
}

fn check_range(what: &'static str, range: &Range<usize>, len: usize) -> Result<()> {
    if range.start > range.end || range.end > len {
        return Err(Error::OutOfRange {
            what,
            start: range.start,
            end: range.end,
            len,
        });
    }
    Ok(())
}

/// A borrowed sub-range of a [`DeviceBuffer`].
#[derive(Clone, Copy, Debug)]
pub struct BufferView<'a, T: Element> {
    buf: &'a DeviceBuffer<T>,
    start: usize,
    len: usize,
}

/// A mutably borrowed sub-range of a [`DeviceBuffer`].
#[derive(Debug)]
pub struct BufferViewMut<'a, T: Element> {
    buf: &'a mut DeviceBuffer<T>,
    start: usize,
    len: usize,
}

impl<'a, T: Element> BufferView<'a, T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn device(&self) -> Device {
        self.buf.device()
    }

    /// The element type, `T::DTYPE`.
    pub fn dtype(&self) -> DType {
        T::DTYPE
    }

    /// Offset of the view's first value in its buffer, in elements.
    pub fn offset(&self) -> usize {
        self.start
    }

    /// A narrower view, `range` relative to this view.
    pub fn slice(&self, range: Range<usize>) -> Result<BufferView<'a, T>> {
        check_range("BufferView::slice", &range, self.len)?;
        Ok(BufferView {
            buf: self.buf,
            start: self.start + range.start,
            len: range.len(),
        })
    }

    pub fn as_host_slice(&self) -> Result<&'a [T]> {
        self.buf
            .host_range("BufferView::as_host_slice", self.start, self.len)
    }

    /// The device address of the view's first value.
    pub fn as_raw_ptr(&self) -> *const T {
        self.buf.as_raw_ptr().wrapping_add(self.start)
    }

    /// The same host bytes seen as values of `U`; the view's byte offset and byte length
    /// must be multiples of `U`'s size and alignment.
    pub fn as_host_slice_cast<U: Element>(&self) -> Result<&'a [U]> {
        reinterpret_range::<T, U>(self.start, self.len)?;
        let bytes: &'a [u8] = bytemuck::cast_slice(self.as_host_slice()?);
        bytemuck::try_cast_slice(bytes).map_err(|_| Error::Alignment {
            what: "as_host_slice_cast",
            offset: self.start * std::mem::size_of::<T>(),
            bytes: bytes.len(),
            align: std::mem::align_of::<U>(),
        })
    }

    pub fn clone_dtoh(&self, stream: &Stream) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len];
        // A meta buffer reads back as zeros, which `out` already is: its pages stay
        // untouched (a 24B model's meta checkpoint copies tens of GB this way).
        if self.device().is_meta() {
            check_device("memcpy_dtoh", stream.device(), self.device())?;
            return Ok(out);
        }
        self.memcpy_dtoh(stream, &mut out)?;
        Ok(out)
    }

    pub fn memcpy_dtoh(&self, stream: &Stream, dst: &mut [T]) -> Result<()> {
        check_len("memcpy_dtoh", dst.len(), self.len)?;
        check_device("memcpy_dtoh", stream.device(), self.device())?;
        match self.device() {
            Device::Cpu => {
                dst.copy_from_slice(self.as_host_slice()?);
                Ok(())
            }
            // No storage: what the host reads back is zeros (see `crate::meta`).
            Device::Meta => {
                dst.fill(T::zeroed());
                Ok(())
            }
            d @ Device::Npu(_) => npu_copy::dtoh(stream, d, self.as_raw_ptr(), dst),
        }
    }
}

impl<'a, T: Element> BufferViewMut<'a, T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn device(&self) -> Device {
        self.buf.device()
    }

    /// The element type, `T::DTYPE`.
    pub fn dtype(&self) -> DType {
        T::DTYPE
    }

    pub fn offset(&self) -> usize {
        self.start
    }

    /// A read-only view of the same range.
    pub fn as_view(&self) -> BufferView<'_, T> {
        BufferView {
            buf: self.buf,
            start: self.start,
            len: self.len,
        }
    }

    /// A narrower mutable view, `range` relative to this view.
    pub fn slice_mut(&mut self, range: Range<usize>) -> Result<BufferViewMut<'_, T>> {
        check_range("BufferViewMut::slice_mut", &range, self.len)?;
        Ok(BufferViewMut {
            buf: self.buf,
            start: self.start + range.start,
            len: range.len(),
        })
    }

    pub fn as_host_slice_mut(&mut self) -> Result<&mut [T]> {
        self.buf
            .host_range_mut("BufferViewMut::as_host_slice_mut", self.start, self.len)
    }

    pub fn as_raw_mut_ptr(&mut self) -> *mut T {
        self.buf.as_raw_mut_ptr().wrapping_add(self.start)
    }

    pub fn memcpy_htod(&mut self, stream: &Stream, src: &[T]) -> Result<()> {
        check_len("memcpy_htod", src.len(), self.len)?;
        check_device("memcpy_htod", stream.device(), self.device())?;
        match self.device() {
            Device::Cpu => {
                self.as_host_slice_mut()?.copy_from_slice(src);
                Ok(())
            }
            Device::Meta => Ok(()),
            d @ Device::Npu(_) => npu_copy::htod(stream, d, src, self.as_raw_mut_ptr()),
        }
    }

    pub fn memcpy_dtod(&mut self, stream: &Stream, src: &BufferView<'_, T>) -> Result<()> {
        check_len("memcpy_dtod", src.len(), self.len)?;
        check_device("memcpy_dtod", self.device(), src.device())?;
        check_device("memcpy_dtod", stream.device(), self.device())?;
        match self.device() {
            Device::Cpu => {
                // Source and destination are distinct borrows (shared vs exclusive), so they
                // cannot overlap.
                let s = src.as_host_slice()?;
                self.as_host_slice_mut()?.copy_from_slice(s);
                Ok(())
            }
            Device::Meta => Ok(()),
            d @ Device::Npu(_) => {
                let (dst, n) = (self.as_raw_mut_ptr(), self.len);
                npu_copy::dtod(stream, d, src.as_raw_ptr(), dst, n)
            }
        }
    }

    pub fn memset_zeros(&mut self, stream: &Stream) -> Result<()> {
        check_device("memset_zeros", stream.device(), self.device())?;
        match self.device() {
            Device::Cpu => {
                self.as_host_slice_mut()?.fill(T::zeroed());
                Ok(())
            }
            Device::Meta => Ok(()),
            d @ Device::Npu(_) => {
                let (dst, n) = (self.as_raw_mut_ptr(), self.len);
                npu_copy::memset_zeros(stream, d, dst, n)
            }
        }
    }
}

fn check_len(what: &'static str, len: usize, expected: usize) -> Result<()> {
    if len != expected {
        return Err(Error::Length {
            what,
            len,
            expected,
        });
    }
    Ok(())
}

fn check_device(what: &'static str, expected: Device, found: Device) -> Result<()> {
    if expected != found {
        return Err(Error::DeviceMismatch {
            what,
            expected,
            found,
        });
    }
    Ok(())
}

/// The element range `(start, len)` in units of `U` that covers the same bytes as elements
/// `start..start+len` of `T`, or an alignment error.
pub fn reinterpret_range<T: Element, U: Element>(
    start: usize,
    len: usize,
) -> Result<(usize, usize)> {
    let (ts, us) = (std::mem::size_of::<T>(), std::mem::size_of::<U>());
    let (off, bytes) = (start * ts, len * ts);
    let align = us.max(std::mem::align_of::<U>());
    if us == 0 || off % align != 0 || bytes % us != 0 {
        return Err(Error::Alignment {
            what: "reinterpret",
            offset: off,
            bytes,
            align,
        });
    }
    Ok((off / us, bytes / us))
}

/// NPU copies go through AscendCL; without the `npu` feature an NPU buffer cannot exist
/// (its allocator cannot be created), so these are unreachable in practice but still typed.
#[cfg(not(feature = "npu"))]
mod npu_copy {
    use super::*;

    fn not_compiled(what: &'static str, device: Device) -> Error {
        Error::NotCompiled { what, device }
    }

    pub(super) fn htod<T: Element>(_: &Stream, device: Device, _: &[T], _: *mut T) -> Result<()> {
        Err(not_compiled("memcpy_htod", device))
    }

    pub(super) fn dtoh<T: Element>(
        _: &Stream,
        device: Device,
        _: *const T,
        _: &mut [T],
    ) -> Result<()> {
        Err(not_compiled("memcpy_dtoh", device))
    }

    pub(super) fn dtod<T: Element>(
        _: &Stream,
        device: Device,
        _: *const T,
        _: *mut T,
        _: usize,
    ) -> Result<()> {
        Err(not_compiled("memcpy_dtod", device))
    }

    pub(super) fn memset_zeros<T: Element>(
        _: &Stream,
        device: Device,
        _: *mut T,
        _: usize,
    ) -> Result<()> {
        Err(not_compiled("memset_zeros", device))
    }
}

/// The NPU copies: the stream's ACL handle, then `crate::npu::copy`.
#[cfg(feature = "npu")]
mod npu_copy {
    use super::*;
    use crate::npu::{copy, NpuStream};

    /// The ACL stream of `stream`, which the caller checked is on `device`.
    fn acl<'a>(stream: &'a Stream, device: Device, what: &'static str) -> Result<&'a NpuStream> {
        stream.acl_stream().ok_or(Error::DeviceMismatch {
            what,
            expected: device,
            found: stream.device(),
        })
    }

    pub(super) fn htod<T: Element>(
        stream: &Stream,
        device: Device,
        src: &[T],
        dst: *mut T,
    ) -> Result<()> {
        copy::htod(acl(stream, device, "memcpy_htod")?, src, dst)
    }

    pub(super) fn dtoh<T: Element>(
        stream: &Stream,
        device: Device,
        src: *const T,
        dst: &mut [T],
    ) -> Result<()> {
        copy::dtoh(acl(stream, device, "memcpy_dtoh")?, src, dst)
    }

    pub(super) fn dtod<T: Element>(
        stream: &Stream,
        device: Device,
        src: *const T,
        dst: *mut T,
        n: usize,
    ) -> Result<()> {
        copy::dtod(acl(stream, device, "memcpy_dtod")?, src, dst, n)
    }

    pub(super) fn memset_zeros<T: Element>(
        stream: &Stream,
        device: Device,
        dst: *mut T,
        n: usize,
    ) -> Result<()> {
        copy::memset_zeros(acl(stream, device, "memset_zeros")?, dst, n)
    }
}

#[cfg(feature = "npu")]
mod pinned;
#[cfg(test)]
mod tests;
