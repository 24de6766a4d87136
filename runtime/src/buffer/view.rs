//! Borrowed sub-ranges of a [`DeviceBuffer`] and the copies between host, views and buffers
//! (a buffer's copies are those of its whole view).

use super::checks::{check_device, check_len, check_range, reinterpret_range};
use super::npu_copy;
use super::owned::DeviceBuffer;
use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::stream::Stream;
use std::ops::Range;

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
        let _span = crate::trace::span_on(stream, "dtoh", crate::trace::Cat::Copy);
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
        let _span = crate::trace::span_on(stream, "htod", crate::trace::Cat::Copy);
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

impl<T: Element> DeviceBuffer<T> {
    pub fn view(&self) -> BufferView<'_, T> {
        BufferView {
            buf: self,
            start: 0,
            len: self.len(),
        }
    }

    pub fn view_mut(&mut self) -> BufferViewMut<'_, T> {
        let len = self.len();
        BufferViewMut {
            buf: self,
            start: 0,
            len,
        }
    }

    /// A view of `range`, checked against the length.
    pub fn slice(&self, range: Range<usize>) -> Result<BufferView<'_, T>> {
        check_range("DeviceBuffer::slice", &range, self.len())?;
        Ok(BufferView {
            buf: self,
            start: range.start,
            len: range.len(),
        })
    }

    /// A mutable view of `range`, checked against the length.
    pub fn slice_mut(&mut self, range: Range<usize>) -> Result<BufferViewMut<'_, T>> {
        check_range("DeviceBuffer::slice_mut", &range, self.len())?;
        Ok(BufferViewMut {
            buf: self,
            start: range.start,
            len: range.len(),
        })
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
}
