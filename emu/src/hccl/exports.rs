//! The exported `Hccl*` symbols: argument checks, then the call queued on its stream.
#![allow(non_snake_case)]

use super::boundary::{edge, host_ptr, non_null, perr, COMMS};
use super::comm::{Comm, Op, Work};
use super::dtype::DType;
use super::transport::{self, Meta, RootInfo, Timeouts, ROOT_INFO_BYTES};
use crate::error::EmuResult;
use crate::stream::{Stream, STREAMS};
use cannon_sys::acl::aclrtStream;
use cannon_sys::hccl::*;
use std::ffi::{c_char, c_void, CStr};
use std::sync::Arc;

/// The largest group the emulator forms (HCCL's own limit is far larger; a test never needs
/// more, and a garbage nRanks should fail fast rather than wait for thousands of ranks).
const MAX_RANKS: u32 = 4096;

fn comm_of(h: HcclComm) -> EmuResult<Arc<Comm>> {
    non_null(h.cast_const(), "comm")?;
    COMMS.get(h as usize)
}

/// The stream `s` names, which must be on the communicator's device.
fn stream_of(comm: &Comm, s: aclrtStream) -> EmuResult<Arc<Stream>> {
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
fn bytes_of(count: u64, size: usize, what: &str) -> EmuResult<usize> {
    count
        .checked_mul(size as u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| perr(HCCL_E_PARA, format!("{what}: count {count} overflows")))
}

/// Checks that `[p, p + bytes)` is device memory of the communicator's device inside one live
/// allocation; returns the address. Nothing to check for zero bytes.
fn dev_buf(comm: &Comm, p: *const c_void, bytes: usize, what: &str) -> EmuResult<usize> {
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

fn meta(op: Op, dtype: HcclDataType, count: u64, reduce: HcclReduceOp, root: u32) -> Meta {
    Meta {
        op: op as u32,
        dtype,
        count,
        reduce,
        root,
    }
}

/// Numbers the call and queues it on `stream`.
fn enqueue(
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

fn check_root(comm: &Comm, root: u32, what: &str) -> EmuResult<()> {
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

fn current_device(call: &str) -> EmuResult<u32> {
    crate::device::current().map_err(|_| {
        perr(
            HCCL_E_PARA,
            format!("{call} needs a current device: call aclrtSetDevice first"),
        )
    })
}

/// # Safety
/// `rootInfo` points to a writable `HcclRootInfo`.
#[no_mangle]
pub unsafe extern "C" fn HcclGetRootInfo(rootInfo: *mut HcclRootInfo) -> HcclResult {
    edge("HcclGetRootInfo", || {
        host_ptr(rootInfo.cast_const(), "rootInfo")?;
        current_device("HcclGetRootInfo")?;
        let info = transport::create_root()?.encode();
        // SAFETY: the caller's HcclRootInfo is ROOT_INFO_BYTES of writable host memory
        // (checked non-null and not device memory above).
        unsafe {
            std::ptr::copy_nonoverlapping(info.as_ptr(), rootInfo.cast::<u8>(), ROOT_INFO_BYTES)
        };
        Ok(())
    })
}

/// # Safety
/// `rootInfo` points to a readable `HcclRootInfo`, `comm` to a writable `HcclComm`.
#[no_mangle]
pub unsafe extern "C" fn HcclCommInitRootInfo(
    nRanks: u32,
    rootInfo: *const HcclRootInfo,
    rank: u32,
    comm: *mut HcclComm,
) -> HcclResult {
    edge("HcclCommInitRootInfo", || {
        host_ptr(rootInfo, "rootInfo")?;
        host_ptr(comm.cast_const(), "comm")?;
        if nRanks == 0 || nRanks > MAX_RANKS {
            return Err(perr(
                HCCL_E_PARA,
                format!("nRanks {nRanks} must be in 1..={MAX_RANKS}"),
            ));
        }
        if rank >= nRanks {
            return Err(perr(
                HCCL_E_PARA,
                format!("rank {rank} is not below nRanks {nRanks}"),
            ));
        }
        let device = current_device("HcclCommInitRootInfo")?;
        // SAFETY: a readable HcclRootInfo of ROOT_INFO_BYTES (checked above).
        let bytes = unsafe { std::slice::from_raw_parts(rootInfo.cast::<u8>(), ROOT_INFO_BYTES) };
        let root = RootInfo::decode(bytes)?;
        let t = Timeouts::from_env()?;
        let mesh = super::bootstrap::connect(&root, nRanks, rank, t)?;
        let h = COMMS.insert(Comm::new(mesh, device, t));
        // SAFETY: writable HcclComm slot (checked above).
        unsafe { *comm = h as HcclComm };
        Ok(())
    })
}

/// # Safety
/// `comm` came from `HcclCommInitRootInfo`.
#[no_mangle]
pub unsafe extern "C" fn HcclCommDestroy(comm: HcclComm) -> HcclResult {
    edge("HcclCommDestroy", || {
        non_null(comm.cast_const(), "comm")?;
        // Jobs still queued hold their own reference; the connections close after them.
        COMMS.remove(comm as usize).map(drop)
    })
}

/// # Safety
/// `rankSize` points to a writable u32.
#[no_mangle]
pub unsafe extern "C" fn HcclGetRankSize(comm: HcclComm, rankSize: *mut u32) -> HcclResult {
    edge("HcclGetRankSize", || {
        let c = comm_of(comm)?;
        host_ptr(rankSize.cast_const(), "rankSize")?;
        // SAFETY: writable host u32 (checked above).
        unsafe { *rankSize = c.n_ranks };
        Ok(())
    })
}

/// # Safety
/// `rank` points to a writable u32.
#[no_mangle]
pub unsafe extern "C" fn HcclGetRankId(comm: HcclComm, rank: *mut u32) -> HcclResult {
    edge("HcclGetRankId", || {
        let c = comm_of(comm)?;
        host_ptr(rank.cast_const(), "rank")?;
        // SAFETY: writable host u32 (checked above).
        unsafe { *rank = c.rank };
        Ok(())
    })
}

/// # Safety
/// `asyncError` points to a writable HcclResult.
#[no_mangle]
pub unsafe extern "C" fn HcclGetCommAsyncError(
    comm: HcclComm,
    asyncError: *mut HcclResult,
) -> HcclResult {
    edge("HcclGetCommAsyncError", || {
        let c = comm_of(comm)?;
        host_ptr(asyncError.cast_const(), "asyncError")?;
        // SAFETY: writable host HcclResult (checked above).
        unsafe { *asyncError = c.async_error() };
        Ok(())
    })
}

/// A static, NUL-terminated name for every code (unknown ones included).
#[no_mangle]
pub extern "C" fn HcclGetErrorString(code: HcclResult) -> *const c_char {
    let s: &'static CStr = match code {
        HCCL_SUCCESS => c"HCCL_SUCCESS: success",
        HCCL_E_PARA => c"HCCL_E_PARA: parameter error",
        HCCL_E_PTR => c"HCCL_E_PTR: empty pointer",
        HCCL_E_MEMORY => c"HCCL_E_MEMORY: memory error",
        HCCL_E_INTERNAL => c"HCCL_E_INTERNAL: internal error",
        HCCL_E_NOT_SUPPORT => c"HCCL_E_NOT_SUPPORT: not supported",
        HCCL_E_NOT_FOUND => c"HCCL_E_NOT_FOUND: not found",
        HCCL_E_UNAVAIL => c"HCCL_E_UNAVAIL: resource unavailable",
        HCCL_E_SYSCALL => c"HCCL_E_SYSCALL: system call error",
        HCCL_E_TIMEOUT => c"HCCL_E_TIMEOUT: timeout",
        HCCL_E_OPEN_FILE_FAILURE => c"HCCL_E_OPEN_FILE_FAILURE: open file fail",
        HCCL_E_TCP_CONNECT => c"HCCL_E_TCP_CONNECT: tcp connect fail",
        HCCL_E_ROCE_CONNECT => c"HCCL_E_ROCE_CONNECT: roce connect fail",
        HCCL_E_TCP_TRANSFER => c"HCCL_E_TCP_TRANSFER: tcp transfer fail",
        HCCL_E_ROCE_TRANSFER => c"HCCL_E_ROCE_TRANSFER: roce transfer fail",
        HCCL_E_RUNTIME => c"HCCL_E_RUNTIME: call runtime api fail",
        HCCL_E_DRV => c"HCCL_E_DRV: call driver api fail",
        HCCL_E_PROFILING => c"HCCL_E_PROFILING: call profiling api fail",
        HCCL_E_CCE => c"HCCL_E_CCE: call cce api fail",
        HCCL_E_NETWORK => c"HCCL_E_NETWORK: call network api fail",
        HCCL_E_AGAIN => c"HCCL_E_AGAIN: try again",
        HCCL_E_REMOTE => c"HCCL_E_REMOTE: error cqe",
        HCCL_E_SUSPENDING => c"HCCL_E_SUSPENDING: error communicator suspending",
        HCCL_E_OPRETRY_FAIL => c"HCCL_E_OPRETRY_FAIL: retry constraint",
        HCCL_E_OOM => c"HCCL_E_OOM: out of memory",
        _ => c"unknown HcclResult",
    };
    s.as_ptr()
}

/// # Safety
/// Buffers are device memory of `count` elements (HCCL's contract); `comm`, `stream` live.
#[no_mangle]
pub unsafe extern "C" fn HcclAllReduce(
    sendBuf: *mut c_void,
    recvBuf: *mut c_void,
    count: u64,
    dataType: HcclDataType,
    op: HcclReduceOp,
    comm: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let name = "HcclAllReduce";
    edge(name, || {
        let c = comm_of(comm)?;
        let s = stream_of(&c, stream)?;
        let dt = DType(dataType);
        dt.check_reduce(op)?;
        let bytes = bytes_of(count, dt.size()?, "count")?;
        let send = dev_buf(&c, sendBuf, bytes, "sendBuf")?;
        let recv = dev_buf(&c, recvBuf, bytes, "recvBuf")?;
        if count == 0 {
            return Ok(());
        }
        let m = meta(Op::AllReduce, dataType, count, op, 0);
        enqueue(name, c, &s, m, Work::AllReduce { send, recv, bytes })
    })
}

/// # Safety
/// As [`HcclAllReduce`]; `recvBuf` matters on `root` only.
#[no_mangle]
pub unsafe extern "C" fn HcclReduce(
    sendBuf: *mut c_void,
    recvBuf: *mut c_void,
    count: u64,
    dataType: HcclDataType,
    op: HcclReduceOp,
    root: u32,
    comm: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let name = "HcclReduce";
    edge(name, || {
        let c = comm_of(comm)?;
        let s = stream_of(&c, stream)?;
        let dt = DType(dataType);
        dt.check_reduce(op)?;
        check_root(&c, root, "root")?;
        let bytes = bytes_of(count, dt.size()?, "count")?;
        let send = dev_buf(&c, sendBuf, bytes, "sendBuf")?;
        let recv = if c.rank == root || !recvBuf.is_null() {
            dev_buf(&c, recvBuf, bytes, "recvBuf")?
        } else {
            0
        };
        if count == 0 {
            return Ok(());
        }
        let m = meta(Op::Reduce, dataType, count, op, root);
        enqueue(
            name,
            c,
            &s,
            m,
            Work::Reduce {
                send,
                recv,
                bytes,
                root,
            },
        )
    })
}

/// # Safety
/// `buf` is device memory of `count` elements; `comm`, `stream` live.
#[no_mangle]
pub unsafe extern "C" fn HcclBroadcast(
    buf: *mut c_void,
    count: u64,
    dataType: HcclDataType,
    root: u32,
    comm: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let name = "HcclBroadcast";
    edge(name, || {
        let c = comm_of(comm)?;
        let s = stream_of(&c, stream)?;
        let bytes = bytes_of(count, DType(dataType).size()?, "count")?;
        check_root(&c, root, "root")?;
        let b = dev_buf(&c, buf, bytes, "buf")?;
        if count == 0 {
            return Ok(());
        }
        let m = meta(Op::Broadcast, dataType, count, 0, root);
        enqueue(
            name,
            c,
            &s,
            m,
            Work::Broadcast {
                buf: b,
                bytes,
                root,
            },
        )
    })
}

/// # Safety
/// `sendBuf` holds `nRanks * recvCount` elements, `recvBuf` `recvCount`, on the device.
#[no_mangle]
pub unsafe extern "C" fn HcclReduceScatter(
    sendBuf: *mut c_void,
    recvBuf: *mut c_void,
    recvCount: u64,
    dataType: HcclDataType,
    op: HcclReduceOp,
    comm: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let name = "HcclReduceScatter";
    edge(name, || {
        let c = comm_of(comm)?;
        let s = stream_of(&c, stream)?;
        let dt = DType(dataType);
        dt.check_reduce(op)?;
        let chunk = bytes_of(recvCount, dt.size()?, "recvCount")?;
        let total = bytes_of(
            recvCount,
            dt.size()? * c.n_ranks as usize,
            "recvCount * nRanks",
        )?;
        let send = dev_buf(&c, sendBuf, total, "sendBuf (recvCount * nRanks elements)")?;
        let recv = dev_buf(&c, recvBuf, chunk, "recvBuf")?;
        if recvCount == 0 {
            return Ok(());
        }
        let m = meta(Op::ReduceScatter, dataType, recvCount, op, 0);
        enqueue(name, c, &s, m, Work::ReduceScatter { send, recv, chunk })
    })
}

/// # Safety
/// `sendBuf` holds `sendCount` elements, `recvBuf` `nRanks * sendCount`, on the device.
#[no_mangle]
pub unsafe extern "C" fn HcclAllGather(
    sendBuf: *mut c_void,
    recvBuf: *mut c_void,
    sendCount: u64,
    dataType: HcclDataType,
    comm: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let name = "HcclAllGather";
    edge(name, || {
        let c = comm_of(comm)?;
        let s = stream_of(&c, stream)?;
        let size = DType(dataType).size()?;
        let chunk = bytes_of(sendCount, size, "sendCount")?;
        let total = bytes_of(sendCount, size * c.n_ranks as usize, "sendCount * nRanks")?;
        let send = dev_buf(&c, sendBuf, chunk, "sendBuf")?;
        let recv = dev_buf(&c, recvBuf, total, "recvBuf (sendCount * nRanks elements)")?;
        if sendCount == 0 {
            return Ok(());
        }
        let m = meta(Op::AllGather, dataType, sendCount, 0, 0);
        enqueue(name, c, &s, m, Work::AllGather { send, recv, chunk })
    })
}

fn check_peer(comm: &Comm, peer: u32, what: &str) -> EmuResult<()> {
    check_root(comm, peer, what)?;
    if peer == comm.rank {
        return Err(perr(
            HCCL_E_PARA,
            format!("{what} {peer} is this rank itself"),
        ));
    }
    Ok(())
}

/// # Safety
/// `sendBuf` is device memory of `count` elements; `comm`, `stream` live.
#[no_mangle]
pub unsafe extern "C" fn HcclSend(
    sendBuf: *mut c_void,
    count: u64,
    dataType: HcclDataType,
    destRank: u32,
    comm: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let name = "HcclSend";
    edge(name, || {
        let c = comm_of(comm)?;
        let s = stream_of(&c, stream)?;
        let bytes = bytes_of(count, DType(dataType).size()?, "count")?;
        check_peer(&c, destRank, "destRank")?;
        let buf = dev_buf(&c, sendBuf, bytes, "sendBuf")?;
        let m = meta(Op::Send, dataType, count, 0, 0);
        enqueue(
            name,
            c,
            &s,
            m,
            Work::Send {
                buf,
                bytes,
                peer: destRank,
            },
        )
    })
}

/// # Safety
/// `recvBuf` is device memory of `count` elements; `comm`, `stream` live.
#[no_mangle]
pub unsafe extern "C" fn HcclRecv(
    recvBuf: *mut c_void,
    count: u64,
    dataType: HcclDataType,
    srcRank: u32,
    comm: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let name = "HcclRecv";
    edge(name, || {
        let c = comm_of(comm)?;
        let s = stream_of(&c, stream)?;
        let bytes = bytes_of(count, DType(dataType).size()?, "count")?;
        check_peer(&c, srcRank, "srcRank")?;
        let buf = dev_buf(&c, recvBuf, bytes, "recvBuf")?;
        // The sender's frame says Send; a receive matches it with the same type and count.
        let m = meta(Op::Send, dataType, count, 0, 0);
        enqueue(
            name,
            c,
            &s,
            m,
            Work::Recv {
                buf,
                bytes,
                peer: srcRank,
            },
        )
    })
}

fn same_type(send: HcclDataType, recv: HcclDataType) -> EmuResult<DType> {
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

/// # Safety
/// Buffers are device memory of `nRanks * count` elements; `comm`, `stream` live.
#[no_mangle]
pub unsafe extern "C" fn HcclAlltoAll(
    sendBuf: *const c_void,
    sendCount: u64,
    sendType: HcclDataType,
    recvBuf: *const c_void,
    recvCount: u64,
    recvType: HcclDataType,
    comm: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let name = "HcclAlltoAll";
    edge(name, || {
        let c = comm_of(comm)?;
        let s = stream_of(&c, stream)?;
        let dt = same_type(sendType, recvType)?;
        let size = dt.size()?;
        if sendCount != recvCount {
            return Err(perr(
                HCCL_E_PARA,
                format!("sendCount {sendCount} differs from recvCount {recvCount}"),
            ));
        }
        let chunk = bytes_of(sendCount, size, "sendCount")?;
        let total = bytes_of(sendCount, size * c.n_ranks as usize, "sendCount * nRanks")?;
        let send = dev_buf(&c, sendBuf, total, "sendBuf (sendCount * nRanks elements)")?;
        let recv = dev_buf(&c, recvBuf, total, "recvBuf (recvCount * nRanks elements)")?;
        if sendCount == 0 {
            return Ok(());
        }
        let m = meta(Op::AlltoAll, sendType, sendCount, 0, 0);
        enqueue(name, c, &s, m, Work::AlltoAll { send, recv, chunk })
    })
}

/// Reads a host `uint64_t[n]` argument.
///
/// # Safety
/// `p` points to `n` readable u64 (checked non-null and host by the caller's `host_ptr`).
unsafe fn host_u64s(p: *const c_void, n: usize, what: &str) -> EmuResult<Vec<u64>> {
    host_ptr(p, what)?;
    if !(p as usize).is_multiple_of(std::mem::align_of::<u64>()) {
        return Err(perr(HCCL_E_PARA, format!("{what} is not 8-byte aligned")));
    }
    // SAFETY: the caller's contract: n u64 of host memory, aligned (checked).
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u64>(), n) }.to_vec())
}

/// Byte (offset, length) per peer from element counts and displacements, and the extent.
fn parts(
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

/// # Safety
/// The four count/displacement arguments are host `uint64_t[nRanks]`; buffers are device
/// memory covering every displacement + count.
#[no_mangle]
pub unsafe extern "C" fn HcclAlltoAllV(
    sendBuf: *const c_void,
    sendCounts: *const c_void,
    sdispls: *const c_void,
    sendType: HcclDataType,
    recvBuf: *const c_void,
    recvCounts: *const c_void,
    rdispls: *const c_void,
    recvType: HcclDataType,
    comm: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let name = "HcclAlltoAllV";
    edge(name, || {
        let c = comm_of(comm)?;
        let s = stream_of(&c, stream)?;
        let dt = same_type(sendType, recvType)?;
        let size = dt.size()?;
        let n = c.n_ranks as usize;
        // SAFETY: HCCL's contract: host arrays of nRanks u64 (host_u64s checks what it can).
        let (sc, sd, rc, rd) = unsafe {
            (
                host_u64s(sendCounts, n, "sendCounts")?,
                host_u64s(sdispls, n, "sdispls")?,
                host_u64s(recvCounts, n, "recvCounts")?,
                host_u64s(rdispls, n, "rdispls")?,
            )
        };
        let (send_parts, send_extent) = parts(&sc, &sd, size, "sendCounts/sdispls")?;
        let (recv_parts, recv_extent) = parts(&rc, &rd, size, "recvCounts/rdispls")?;
        let send = dev_buf(&c, sendBuf, send_extent, "sendBuf")?;
        let recv = dev_buf(&c, recvBuf, recv_extent, "recvBuf")?;
        let m = meta(Op::AlltoAllV, sendType, 0, 0, 0);
        let work = Work::AlltoAllV {
            send,
            send_parts,
            recv,
            recv_parts,
            elem: size,
        };
        enqueue(name, c, &s, m, work)
    })
}

/// # Safety
/// `comm`, `stream` live.
#[no_mangle]
pub unsafe extern "C" fn HcclBarrier(comm: HcclComm, stream: aclrtStream) -> HcclResult {
    let name = "HcclBarrier";
    edge(name, || {
        let c = comm_of(comm)?;
        let s = stream_of(&c, stream)?;
        let m = meta(Op::Barrier, HCCL_DATA_TYPE_INT8, 0, 0, 0);
        enqueue(name, c, &s, m, Work::Barrier)
    })
}
