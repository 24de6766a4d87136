//! The exported `Hccl*` collectives and point-to-point calls: arguments checked (`args`),
//! then the call queued on its stream.
#![allow(non_snake_case)]

use super::args::{
    bytes_of, check_peer, check_root, comm_of, dev_buf, enqueue, host_u64s, meta, parts, same_type,
    stream_of,
};
use super::boundary::{edge, perr};
use super::dtype::DType;
use super::work::{Op, Work};
use cannon_sys::acl::aclrtStream;
use cannon_sys::hccl::*;
use std::ffi::c_void;

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
