//! The runtime's error type: every variant names the failing call, the device or the rank.

use crate::device::Device;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    /// A CANN/dlopen failure below us (library or symbol missing).
    #[error(transparent)]
    Sys(#[from] cannon_sys::Error),
    /// An AscendCL call returned a non-zero `aclError`.
    #[error("{call} failed with aclError {code} ({name}){}", fmt_msg(.message))]
    Acl {
        call: &'static str,
        code: i32,
        name: &'static str,
        message: String,
    },
    /// The device exists in the API but this build does not contain its code path.
    #[error("{what} on {device}: this build has no NPU support (rebuild with `--features npu`)")]
    NotCompiled { what: &'static str, device: Device },
    /// Two operands of one call live on different devices.
    #[error("{what}: device mismatch, expected {expected}, found {found}")]
    DeviceMismatch {
        what: &'static str,
        expected: Device,
        found: Device,
    },
    /// A copy or view whose lengths do not match.
    #[error("{what}: length mismatch, got {len} elements, expected {expected}")]
    Length {
        what: &'static str,
        len: usize,
        expected: usize,
    },
    /// A view range outside its buffer.
    #[error("{what}: range {start}..{end} out of bounds for length {len}")]
    OutOfRange {
        what: &'static str,
        start: usize,
        end: usize,
        len: usize,
    },
    /// A reinterpretation whose byte offset or length does not fit the target type.
    #[error("{what}: byte offset {offset} / length {bytes} not a multiple of {align}")]
    Alignment {
        what: &'static str,
        offset: usize,
        bytes: usize,
        align: usize,
    },
    /// Host access to memory that lives on a device.
    #[error("{what}: memory on {device} is not host-accessible; copy it with clone_dtoh")]
    NotHostAccessible { what: &'static str, device: Device },
    /// The allocator could not get memory from the device (or the host).
    #[error("out of memory on {device}: requested {requested} bytes ({allocated} allocated, {reserved} reserved)")]
    OutOfMemory {
        device: Device,
        requested: usize,
        allocated: usize,
        reserved: usize,
    },
    /// Timing or waiting on an event that was never recorded.
    #[error("{what}: the event was never recorded")]
    NotRecorded { what: &'static str },
    /// A collective failed (timeout, a peer gone, mismatched calls, HCCL status).
    #[error(transparent)]
    Comm(#[from] crate::comm::error::CommError),
    /// The host refused to map or unmap memory for the CPU allocator.
    #[error("{call} of {bytes} bytes of host memory failed: {source}")]
    HostMemory {
        call: &'static str,
        bytes: usize,
        #[source]
        source: std::io::Error,
    },
    /// An argument the call cannot take (a write past a host tensor's end, a host tensor
    /// with no values to read).
    #[error("{what}: invalid argument: {detail}")]
    InvalidArgument { what: &'static str, detail: String },
    /// An element count whose byte size overflows `usize`.
    #[error("{what}: {len} elements of {elem} bytes overflow the address space")]
    SizeOverflow {
        what: &'static str,
        len: usize,
        elem: usize,
    },
}

fn fmt_msg(m: &str) -> String {
    if m.is_empty() {
        String::new()
    } else {
        format!(": {m}")
    }
}

pub type Result<T> = std::result::Result<T, Error>;
