//! The copies of NPU buffers, through AscendCL with the `npu` feature, or typed errors
//! without it.

#[cfg(not(feature = "npu"))]
pub(super) use absent::*;
#[cfg(feature = "npu")]
pub(super) use acl::*;

/// NPU copies go through AscendCL; without the `npu` feature an NPU buffer cannot exist
/// (its allocator cannot be created), so these are unreachable in practice but still typed.
#[cfg(not(feature = "npu"))]
mod absent {
    use crate::device::Device;
    use crate::dtype::Element;
    use crate::error::{Error, Result};
    use crate::stream::Stream;

    fn not_compiled(what: &'static str, device: Device) -> Error {
        Error::NotCompiled { what, device }
    }

    pub(crate) fn htod<T: Element>(_: &Stream, device: Device, _: &[T], _: *mut T) -> Result<()> {
        Err(not_compiled("memcpy_htod", device))
    }

    pub(crate) fn dtoh<T: Element>(
        _: &Stream,
        device: Device,
        _: *const T,
        _: &mut [T],
    ) -> Result<()> {
        Err(not_compiled("memcpy_dtoh", device))
    }

    pub(crate) fn dtod<T: Element>(
        _: &Stream,
        device: Device,
        _: *const T,
        _: *mut T,
        _: usize,
    ) -> Result<()> {
        Err(not_compiled("memcpy_dtod", device))
    }

    pub(crate) fn memset_zeros<T: Element>(
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
mod acl {
    use crate::device::Device;
    use crate::dtype::Element;
    use crate::error::{Error, Result};
    use crate::npu::{copy, NpuStream};
    use crate::stream::Stream;

    /// The ACL stream of `stream`, which the caller checked is on `device`.
    fn acl<'a>(stream: &'a Stream, device: Device, what: &'static str) -> Result<&'a NpuStream> {
        stream.acl_stream().ok_or(Error::DeviceMismatch {
            what,
            expected: device,
            found: stream.device(),
        })
    }

    pub(crate) fn htod<T: Element>(
        stream: &Stream,
        device: Device,
        src: &[T],
        dst: *mut T,
    ) -> Result<()> {
        copy::htod(acl(stream, device, "memcpy_htod")?, src, dst)
    }

    pub(crate) fn dtoh<T: Element>(
        stream: &Stream,
        device: Device,
        src: *const T,
        dst: &mut [T],
    ) -> Result<()> {
        copy::dtoh(acl(stream, device, "memcpy_dtoh")?, src, dst)
    }

    pub(crate) fn dtod<T: Element>(
        stream: &Stream,
        device: Device,
        src: *const T,
        dst: *mut T,
        n: usize,
    ) -> Result<()> {
        copy::dtod(acl(stream, device, "memcpy_dtod")?, src, dst, n)
    }

    pub(crate) fn memset_zeros<T: Element>(
        stream: &Stream,
        device: Device,
        dst: *mut T,
        n: usize,
    ) -> Result<()> {
        copy::memset_zeros(acl(stream, device, "memset_zeros")?, dst, n)
    }
}
