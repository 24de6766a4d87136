//! `Tensor<T>`: a [`DeviceBuffer`] with a shape: the unit in which the trainer holds
//! parameters, gradients, optimizer state and activations on a device.
//!
//! A tensor is contiguous and row-major; the shape only describes the buffer (`numel` =
//! product of the dims = buffer length), it never strides. Ops take the runtime's views
//! ([`Tensor::view`], [`Tensor::view_mut`]) plus their own dims, as every entry point of
//! [`crate::ops`] does; [`Tensor::rows`] / [`Tensor::rows_mut`] narrow dim 0 (one image of a batch, a chunk
//! of tokens).
//!
//! ```text
//! let x = Tensor::<f32>::zeros(&stream, &[t, d])?;         // [T, D] zeros
//! let y = Tensor::from_host(&stream, &host, &[t, d])?;     // upload
//! let first = x.rows(0..1)?;                               // BufferView of row 0: [1, D]
//! let back: Vec<f32> = y.to_host(&stream)?;                // read back
//! ```
//!
//! Memory comes from the device's caching allocator ([`Device::allocator`]) or,
//! with the `_in` constructors, from a given one (a trainer that wants its own figures).

use crate::error::{KernelError, Result};
use cannon_runtime::{
    BufferView, BufferViewMut, CachingAllocator, DType, Device, DeviceBuffer, Element, Stream,
};
use std::ops::Range;
use std::sync::Arc;

/// A contiguous row-major tensor of `T` on one device.
pub struct Tensor<T: Element> {
    buf: DeviceBuffer<T>,
    shape: Vec<usize>,
}

impl<T: Element> std::fmt::Debug for Tensor<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor<{}>{:?} on {}",
            self.dtype(),
            self.shape,
            self.device()
        )
    }
}

/// The number of elements of `shape`, or a shape error on overflow.
pub fn numel(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| KernelError::Shape {
            op: "Tensor",
            detail: format!("shape {shape:?} overflows usize"),
        })
}

impl<T: Element> Tensor<T> {
    /// A tensor over `buf`, whose length must be the shape's element count.
    pub fn from_buffer(buf: DeviceBuffer<T>, shape: &[usize]) -> Result<Self> {
        let n = numel(shape)?;
        if buf.len() != n {
            return Err(KernelError::Shape {
                op: "Tensor::from_buffer",
                detail: format!("buffer holds {} elements, shape {shape:?} {n}", buf.len()),
            });
        }
        Ok(Tensor {
            buf,
            shape: shape.to_vec(),
        })
    }

    /// Uninitialised contents (whatever the allocator's cached block held): for outputs an op
    /// overwrites completely.
    pub fn empty(stream: &Stream, shape: &[usize]) -> Result<Self> {
        Self::empty_on(&stream.device().allocator()?, stream, shape)
    }

    /// [`Tensor::empty`] from a given allocator (its device decides where the tensor lives),
    /// for work on `stream`: its memory is reused on another stream only after the work
    /// queued on `stream` before the drop (`DeviceBuffer::alloc_on`).
    pub fn empty_on(
        alloc: &Arc<CachingAllocator>,
        stream: &Stream,
        shape: &[usize],
    ) -> Result<Self> {
        let buf = DeviceBuffer::alloc_on(alloc, stream, numel(shape)?)?;
        Self::from_buffer(buf, shape)
    }

    /// [`Tensor::empty`] from a given allocator for no stream in particular: the caller
    /// orders its uses (`DeviceBuffer::alloc_in`); prefer [`Tensor::empty_on`].
    pub fn empty_in(alloc: &Arc<CachingAllocator>, shape: &[usize]) -> Result<Self> {
        let buf = DeviceBuffer::alloc_in(alloc, numel(shape)?)?;
        Self::from_buffer(buf, shape)
    }

    /// Zeros on the stream's device.
    pub fn zeros(stream: &Stream, shape: &[usize]) -> Result<Self> {
        Self::zeros_in(&stream.device().allocator()?, stream, shape)
    }

    /// Zeros from a given allocator, zeroed on `stream` (same device); a block the host maps
    /// anew comes resident and zeroed from the kernel and is not written twice
    /// (`DeviceBuffer::alloc_zeros_on`).
    pub fn zeros_in(
        alloc: &Arc<CachingAllocator>,
        stream: &Stream,
        shape: &[usize],
    ) -> Result<Self> {
        let buf = DeviceBuffer::alloc_zeros_on(alloc, stream, numel(shape)?)?;
        Self::from_buffer(buf, shape)
    }

    /// A copy of host `data` (length = the shape's element count) on the stream's device.
    pub fn from_host(stream: &Stream, data: &[T], shape: &[usize]) -> Result<Self> {
        Self::from_host_in(&stream.device().allocator()?, stream, data, shape)
    }

    /// [`Tensor::from_host`] from a given allocator.
    pub fn from_host_in(
        alloc: &Arc<CachingAllocator>,
        stream: &Stream,
        data: &[T],
        shape: &[usize],
    ) -> Result<Self> {
        let mut t = Self::empty_on(alloc, stream, shape)?;
        t.buf.memcpy_htod(stream, data)?;
        Ok(t)
    }

    /// A host copy of the values, row-major.
    pub fn to_host(&self, stream: &Stream) -> Result<Vec<T>> {
        Ok(self.buf.clone_dtoh(stream)?)
    }

    /// A new tensor of the same shape, on the same allocator, holding a copy of the values.
    pub fn try_clone(&self, stream: &Stream) -> Result<Self> {
        let mut t = Self::empty_on(self.buf.allocator(), stream, &self.shape)?;
        t.buf.memcpy_dtod(stream, &self.buf.view())?;
        Ok(t)
    }

    /// Sets every element to zero.
    pub fn zero(&mut self, stream: &Stream) -> Result<()> {
        Ok(self.buf.memset_zeros(stream)?)
    }

    /// The same values under another shape with the same element count.
    pub fn reshape(self, shape: &[usize]) -> Result<Self> {
        Self::from_buffer(self.buf, shape)
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements (the product of the shape).
    pub fn numel(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn device(&self) -> Device {
        self.buf.device()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        T::DTYPE
    }

    /// Bytes the values occupy (the allocator's block is this rounded up to its granularity).
    pub fn num_bytes(&self) -> usize {
        self.buf.num_bytes()
    }

    /// Elements of one index of dim 0 (the product of the other dims; 1 for a 1-D tensor).
    pub fn row_len(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    /// Size of dim 0 (1 for a 0-D tensor).
    pub fn rows_count(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    pub fn view(&self) -> BufferView<'_, T> {
        self.buf.view()
    }

    pub fn view_mut(&mut self) -> BufferViewMut<'_, T> {
        self.buf.view_mut()
    }

    /// Dim 0 narrowed to `rows`: elements `rows.start * row_len .. rows.end * row_len`.
    pub fn rows(&self, rows: Range<usize>) -> Result<BufferView<'_, T>> {
        Ok(self.buf.slice(self.row_span(&rows)?)?)
    }

    /// Mutable [`Tensor::rows`].
    pub fn rows_mut(&mut self, rows: Range<usize>) -> Result<BufferViewMut<'_, T>> {
        let span = self.row_span(&rows)?;
        Ok(self.buf.slice_mut(span)?)
    }

    fn row_span(&self, rows: &Range<usize>) -> Result<Range<usize>> {
        if rows.start > rows.end || rows.end > self.rows_count() {
            return Err(KernelError::Shape {
                op: "Tensor::rows",
                detail: format!("rows {rows:?} of shape {:?}", self.shape),
            });
        }
        let n = self.row_len();
        Ok(rows.start * n..rows.end * n)
    }

    pub fn buffer(&self) -> &DeviceBuffer<T> {
        &self.buf
    }

    pub fn buffer_mut(&mut self) -> &mut DeviceBuffer<T> {
        &mut self.buf
    }

    pub fn into_buffer(self) -> DeviceBuffer<T> {
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_shapes_and_round_trip() {
        let s = Stream::cpu();
        let z = Tensor::<f32>::zeros(&s, &[3, 4]).unwrap();
        assert_eq!(z.shape(), &[3, 4]);
        assert_eq!((z.numel(), z.row_len(), z.rows_count()), (12, 4, 3));
        assert_eq!(z.to_host(&s).unwrap(), vec![0.0; 12]);
        assert_eq!(z.dtype(), DType::F32);
        let data: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let t = Tensor::from_host(&s, &data, &[3, 2, 2]).unwrap();
        assert_eq!(t.row_len(), 4);
        assert_eq!(t.rows(1..2).unwrap().as_host_slice().unwrap(), &data[4..8]);
        assert_eq!(t.try_clone(&s).unwrap().to_host(&s).unwrap(), data);
        let r = t.reshape(&[6, 2]).unwrap();
        assert_eq!(r.rows(5..6).unwrap().as_host_slice().unwrap(), &data[10..]);
        assert!(r.reshape(&[5, 2]).is_err());
    }

    #[test]
    fn bad_shapes_and_rows_are_errors() {
        let s = Stream::cpu();
        assert!(Tensor::<f32>::from_host(&s, &[1.0; 5], &[2, 3]).is_err());
        assert!(Tensor::<f32>::zeros(&s, &[usize::MAX, 2]).is_err());
        let mut t = Tensor::<f32>::zeros(&s, &[2, 3]).unwrap();
        assert!(t.rows(1..3).is_err());
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = 2..1;
        assert!(t.rows_mut(backwards).is_err());
        t.rows_mut(1..2).unwrap().memset_zeros(&s).unwrap();
    }

    #[test]
    fn private_allocator_counts_the_blocks() {
        let alloc = CachingAllocator::new_cpu();
        let s = Stream::cpu();
        let t = Tensor::<half::bf16>::zeros_in(&alloc, &s, &[10, 30]).unwrap();
        assert_eq!(t.num_bytes(), 600);
        assert_eq!(alloc.stats().allocated, 1024); // two 512-byte granules
        drop(t);
        assert_eq!(alloc.stats().allocated, 0);
    }
}
