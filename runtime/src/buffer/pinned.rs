//! Asynchronous copies between device buffers and pinned host buffers (feature `npu`).

use super::checks::{check_device, check_len};
use super::owned::DeviceBuffer;
use super::view::{BufferView, BufferViewMut};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::npu::{pinned, NpuStream, PinnedHostBuffer};
use crate::stream::Stream;
use crate::Device;

fn acl<'a>(stream: &'a Stream, what: &'static str, device: Device) -> Result<&'a NpuStream> {
    check_device(what, stream.device(), device)?;
    stream.acl_stream().ok_or(Error::DeviceMismatch {
        what,
        expected: device,
        found: stream.device(),
    })
}

fn check_pinned(what: &'static str, device: Device, ordinal: u32) -> Result<()> {
    check_device(what, device, Device::Npu(ordinal))
}

impl<T: Element> DeviceBuffer<T> {
    /// Queues a copy of `src` into the buffer on `stream` and returns at once; `src` waits
    /// for the copy before its next host access.
    pub fn memcpy_htod_async(
        &mut self,
        stream: &Stream,
        src: &mut PinnedHostBuffer<T>,
    ) -> Result<()> {
        self.view_mut().memcpy_htod_async(stream, src)
    }

    /// Queues a copy of the buffer into `dst` on `stream` and returns at once; reading `dst`
    /// waits for the copy.
    pub fn memcpy_dtoh_async(&self, stream: &Stream, dst: &mut PinnedHostBuffer<T>) -> Result<()> {
        self.view().memcpy_dtoh_async(stream, dst)
    }
}

impl<T: Element> BufferViewMut<'_, T> {
    /// See [`DeviceBuffer::memcpy_htod_async`].
    pub fn memcpy_htod_async(
        &mut self,
        stream: &Stream,
        src: &mut PinnedHostBuffer<T>,
    ) -> Result<()> {
        const WHAT: &str = "memcpy_htod_async";
        check_len(WHAT, src.len(), self.len())?;
        check_pinned(WHAT, self.device(), src.ordinal())?;
        let s = acl(stream, WHAT, self.device())?;
        let _span = crate::trace::span_on(stream, "htod", crate::trace::Cat::Copy);
        pinned::htod_async(s, src, self.as_raw_mut_ptr())
    }
}

impl<T: Element> BufferView<'_, T> {
    /// See [`DeviceBuffer::memcpy_dtoh_async`].
    pub fn memcpy_dtoh_async(&self, stream: &Stream, dst: &mut PinnedHostBuffer<T>) -> Result<()> {
        const WHAT: &str = "memcpy_dtoh_async";
        check_len(WHAT, dst.len(), self.len())?;
        check_pinned(WHAT, self.device(), dst.ordinal())?;
        let s = acl(stream, WHAT, self.device())?;
        let _span = crate::trace::span_on(stream, "dtoh", crate::trace::Cat::Copy);
        pinned::dtoh_async(s, self.as_raw_ptr(), dst)
    }
}
