//! The checks the exported `Hccl*` functions make of their arguments before anything is
//! queued, and the queuing of a checked call on its stream.

use super::boundary::{host_ptr, non_null, perr, COMMS};
use super::comm::Comm;
use super::dtype::DType;
use super::transport::Meta;
use super::work::{Op, Work};
use crate::error::EmuResult;
use crate::stream::{Stream, STREAMS};
use cannon_sys::acl::aclrtStream;
use cannon_sys::hccl::*;
use std::ffi::c_void;
use std::sync::Arc;

pub(super) fn comm_of(h: HcclComm) -> EmuResult<Arc<Comm>> {
    non_null(h.cast_const(), "comm")?;
    COMMS.get(h as usize)
}

/// The stream `s` names, which must be on the communicator's device.
pub(super) fn stream_of(comm: &Comm, s: aclrtStream) -> EmuResult<Arc<Stream>> {
    non_null(s.cast_const(), "stream")?;
    let st = STREAMS
        .get(s as usize)
        .map_err(|e| perr(HCCL_E_PARA, e.message))?;
    if st.device != comm.device {
        return Err(perr(
            HCCL_E_PARA,
            format!(
                "the stream is on device {}, the communicator (rank {}) on device {}",
                st.device, comm.rank, comm.device
            ),
        ));
    }
    Ok(st)
}

/// `count` elements of `size` bytes, as a byte length.
pub(super) fn bytes_of(count: u64, size: usize, what: &str) -> EmuResult<usize> {
    count
        .checked_mul(size as u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| perr(HCCL_E_PARA, format!("{what}: count {count} overflows")))
}

/// Checks that `[p, p + bytes)` is device memory of the communicator's device inside one live
/// allocation; returns the address. Nothing to check for zero bytes.
pub(super) fn dev_buf(comm: &Comm, p: *const c_void, bytes: usize, what: &str) -> EmuResult<usize> {
    if bytes == 0 {
        return Ok(p as usize);
    }
    non_null(p, what)?;
    let addr = p as usize;
    let owner = crate::mem::owner(addr).map_err(|_| {
        perr(
            HCCL_E_PARA,
            format!("{what} {addr:#x} is not device memory (a host pointer?)"),
        )
    })?;
    if owner != comm.device {
        return Err(perr(
            HCCL_E_PARA,
            format!(
                "{what} is on device {owner}, the communicator (rank {}) on device {}",
                comm.rank, comm.device
            ),
        ));
    }
    crate::mem::resolve(addr, bytes).map_err(|e| {
        perr(
            HCCL_E_PARA,
            format!("{what} must hold {bytes} bytes: {}", e.message),
        )
    })?;
    Ok(addr)
}

pub(super) fn meta(
    op: Op,
    dtype: HcclDataType,
    count: u64,
    reduce: HcclReduceOp,
    root: u32,
) -> Meta {
    Meta {
        op: op as u32,
        dtype,
        count,
        reduce,
        root,
    }
}

/// Numbers the call and queues it on `stream`.
pub(super) fn enqueue(
    name: &'static str,
    comm: Arc<Comm>,
    stream: &Stream,
    meta: Meta,
    work: Work,
) -> EmuResult<()> {
    let (_, seq) = comm.number(&work);
    stream
        .enqueue(Box::new(move || comm.run(name, seq, meta, work)))
        .map_err(|e| perr(HCCL_E_INTERNAL, e.message))?;
    Ok(())
}

pub(super) fn check_root(comm: &Comm, root: u32, what: &str) -> EmuResult<()> {
    if root >= comm.n_ranks {
        return Err(perr(
            HCCL_E_PARA,
            format!(
                "{what} {root} is not a rank of this group of {}",
                comm.n_ranks
            ),
        ));
    }
    Ok(())
}

pub(super) fn current_device(call: &str) -> EmuResult<u32> {
    crate::device::current().map_err(|_| {
        perr(
            HCCL_E_PARA,
            format!("{call} needs a current device: call aclrtSetDevice first"),
        )
    })
}
pub(super) fn check_peer(comm: &Comm, peer: u32, what: &str) -> EmuResult<()> {
    check_root(comm, peer, what)?;
    if peer == comm.rank {
        return Err(perr(
            HCCL_E_PARA,
            format!("{what} {peer} is this rank itself"),
        ));
    }
    Ok(())
}

pub(super) fn same_type(send: HcclDataType, recv: HcclDataType) -> EmuResult<DType> {
    if send != recv {
        return Err(perr(
            HCCL_E_PARA,
            format!(
                "sendType {} and recvType {} differ",
                DType(send).name(),
                DType(recv).name()
            ),
        ));
    }
    Ok(DType(send))
}

/// Reads a host `uint64_t[n]` argument.
///
/// # Safety
/// `p` points to `n` readable u64 (checked non-null and host by the caller's `host_ptr`).
pub(super) unsafe fn host_u64s(p: *const c_void, n: usize, what: &str) -> EmuResult<Vec<u64>> {
    host_ptr(p, what)?;
    if !(p as usize).is_multiple_of(std::mem::align_of::<u64>()) {
        return Err(perr(HCCL_E_PARA, format!("{what} is not 8-byte aligned")));
    }
    // SAFETY: the caller's contract: n u64 of host memory, aligned (checked).
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u64>(), n) }.to_vec())
}

/// Byte (offset, length) per peer from element counts and displacements, and the extent.
pub(super) fn parts(
    counts: &[u64],
    displs: &[u64],
    size: usize,
    what: &str,
) -> EmuResult<(Vec<(usize, usize)>, usize)> {
    let mut out = Vec::with_capacity(counts.len());
    let mut extent = 0usize;
    for (&cnt, &d) in counts.iter().zip(displs) {
        let len = bytes_of(cnt, size, what)?;
        let off = bytes_of(d, size, what)?;
        let end = off
            .checked_add(len)
            .ok_or_else(|| perr(HCCL_E_PARA, format!("{what}: displacement overflows")))?;
        if len > 0 {
            extent = extent.max(end);
        }
        out.push((off, len));
    }
    Ok((out, extent))
}
