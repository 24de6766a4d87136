//! Pinned (page-locked) host memory from `aclrtMallocHost`: the host side of asynchronous
//! copies. `aclrtMemcpyAsync` only returns before the copy has run when the host memory is
//! pinned; with ordinary memory it waits (hicann/runtime's aclrtMemcpyAsync page), so
//! overlapping transfers with compute needs this type.
//!
//! Safety by construction: a copy queued on a stream records an event in the buffer, and every
//! host access ([`PinnedHostBuffer::as_slice`], [`PinnedHostBuffer::as_mut_slice`]) and the
//! drop first wait for it, so the host never reads bytes the stream has not written yet, nor
//! writes (or frees) bytes the stream has not read yet.

use super::result::{self, check};
use super::stream::{NpuEvent, NpuStream};
use crate::dtype::Element;
use crate::error::{Error, Result};
use cannon_sys::acl;
use std::ffi::c_void;
use std::marker::PhantomData;

/// The address alignment `aclrtMemcpyAsync` requires (docs/cann-api.md §0.9).
pub const ASYNC_ALIGN: usize = 64;

/// `len` values of `T` in pinned host memory of NPU `ordinal`'s process, freed on drop.
pub struct PinnedHostBuffer<T: Element> {
    ptr: *mut T,
    len: usize,
    ordinal: u32,
    /// The last copy queued against this buffer, not yet known to be finished.
    pending: Option<NpuEvent>,
    _t: PhantomData<T>,
}

// SAFETY: the buffer owns its block; host access goes through &self/&mut self after the
// pending copy has finished, so moving it or sharing & between threads is as for Vec<T>.
unsafe impl<T: Element> Send for PinnedHostBuffer<T> {}
// SAFETY: see Send; shared access only reads.
unsafe impl<T: Element> Sync for PinnedHostBuffer<T> {}

impl<T: Element> std::fmt::Debug for PinnedHostBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PinnedHostBuffer<{}>[{}] for npu:{}",
            std::any::type_name::<T>(),
            self.len,
            self.ordinal
        )
    }
}

impl<T: Element> PinnedHostBuffer<T> {
    /// `len` zeros in pinned memory (AscendCL binds it to the process; `ordinal` is the device
    /// whose context allocates it and whose streams copy it).
    pub fn new(ordinal: u32, len: usize) -> Result<Self> {
        super::context::bind(ordinal)?;
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or(Error::SizeOverflow {
                what: "PinnedHostBuffer::new",
                len,
                elem: std::mem::size_of::<T>(),
            })?;
        if bytes == 0 {
            return Ok(Self {
                ptr: std::ptr::NonNull::dangling().as_ptr(),
                len: 0,
                ordinal,
                pending: None,
                _t: PhantomData,
            });
        }
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: p is a valid out-pointer; the device is bound.
        check("aclrtMallocHost", unsafe {
            acl::aclrtMallocHost(&mut p, bytes)
        })?;
        if !(p as usize).is_multiple_of(std::mem::align_of::<T>()) {
            // SAFETY: p came from aclrtMallocHost just now.
            let _ = unsafe { acl::aclrtFreeHost(p) };
            return Err(Error::Alignment {
                what: "aclrtMallocHost",
                offset: p as usize,
                bytes,
                align: std::mem::align_of::<T>(),
            });
        }
        // SAFETY: a fresh host block of `bytes`; zeroing makes every later read a valid T.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, bytes) };
        Ok(Self {
            ptr: p.cast(),
            len,
            ordinal,
            pending: None,
            _t: PhantomData,
        })
    }

    /// A pinned copy of `src`.
    pub fn from_slice(ordinal: u32, src: &[T]) -> Result<Self> {
        let mut b = Self::new(ordinal, src.len())?;
        b.as_mut_slice()?.copy_from_slice(src);
        Ok(b)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Waits for the last queued copy, if any.
    pub fn synchronize(&self) -> Result<()> {
        match &self.pending {
            Some(e) => e.synchronize(),
            None => Ok(()),
        }
    }

    /// The values, after the last queued copy has finished.
    pub fn as_slice(&self) -> Result<&[T]> {
        self.synchronize()?;
        // SAFETY: ptr holds len initialised values (zeroed at creation, then written only with
        // T values by the host or by copies of T buffers) and no copy is in flight.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
    }

    /// The values mutably, after the last queued copy has finished.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.synchronize()?;
        self.pending = None;
        // SAFETY: as in as_slice; &mut self makes this the only access.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }

    /// The host address, for copies (`crate::npu::copy`).
    pub(crate) fn raw(&self) -> *mut T {
        self.ptr
    }

    /// Notes that a copy touching this buffer was queued on `stream`: later host access
    /// waits for it.
    pub(crate) fn mark_pending(&mut self, stream: &NpuStream) -> Result<()> {
        let e = NpuEvent::new(stream.ordinal())?;
        e.record(stream)?;
        self.pending = Some(e);
        Ok(())
    }
}

impl<T: Element> Drop for PinnedHostBuffer<T> {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        // A queued copy still reads or writes the block: wait before freeing it. Errors
        // cannot leave Drop; a failed wait or free leaks the block rather than risk a use
        // after free.
        if self.synchronize().is_err() || super::context::bind(self.ordinal).is_err() {
            return;
        }
        // SAFETY: ptr came from aclrtMallocHost and no copy is in flight.
        let _ = unsafe { acl::aclrtFreeHost(self.ptr.cast()) };
    }
}

/// Queues a copy of `src` (pinned) to the device address `dst` on `s`.
pub(crate) fn htod_async<T: Element>(
    s: &NpuStream,
    src: &mut PinnedHostBuffer<T>,
    dst: *mut T,
) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    src.synchronize()?;
    let bytes = src.len() * std::mem::size_of::<T>();
    if !(dst as usize).is_multiple_of(ASYNC_ALIGN) {
        // aclrtMemcpyAsync wants 64-byte aligned addresses; a view at another offset is
        // copied synchronously in stream order instead.
        s.synchronize()?;
        // SAFETY: as below, and the copy is complete when the call returns.
        return unsafe {
            result::memcpy(
                dst.cast(),
                src.raw() as *const c_void,
                bytes,
                result::ACL_MEMCPY_HOST_TO_DEVICE,
            )
        };
    }
    // SAFETY: dst is a device range of src.len() values (checked by the caller); src is
    // pinned and, through mark_pending, neither touched by the host nor freed before the
    // stream has run the copy.
    unsafe {
        result::memcpy_async(
            dst.cast(),
            src.raw() as *const c_void,
            bytes,
            result::ACL_MEMCPY_HOST_TO_DEVICE,
            s.raw(),
        )
    }?;
    src.mark_pending(s)
}

/// Queues a copy from the device address `src` into `dst` (pinned) on `s`.
pub(crate) fn dtoh_async<T: Element>(
    s: &NpuStream,
    src: *const T,
    dst: &mut PinnedHostBuffer<T>,
) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    // The previous copy into or out of dst finishes first (a second copy would race it).
    dst.synchronize()?;
    let bytes = dst.len() * std::mem::size_of::<T>();
    if !(src as usize).is_multiple_of(ASYNC_ALIGN) {
        // See htod_async.
        s.synchronize()?;
        // SAFETY: as below, and the copy is complete when the call returns.
        return unsafe {
            result::memcpy(
                dst.raw().cast(),
                src as *const c_void,
                bytes,
                result::ACL_MEMCPY_DEVICE_TO_HOST,
            )
        };
    }
    // SAFETY: as in htod_async, with the roles swapped.
    unsafe {
        result::memcpy_async(
            dst.raw().cast(),
            src as *const c_void,
            bytes,
            result::ACL_MEMCPY_DEVICE_TO_HOST,
            s.raw(),
        )
    }?;
    dst.mark_pending(s)
}
