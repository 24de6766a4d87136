//! The HCCL backend of [`Communicator`](super::Communicator) (feature `npu`): the same calls
//! over NPU buffers, one process per NPU.
//!
//! Differences from the CPU communicator, all from HCCL:
//! - Calls are enqueued on an explicit [`Stream`] and return before the data moved; order them
//!   with the stream (events, `synchronize`) like any other device work. `barrier` alone
//!   synchronises its stream, so that it is a host-side barrier as on the CPU.
//! - HCCL cannot check that ranks agree on a call: a mismatch is an HCCL error or a hang until
//!   HCCL's own timeouts (`HCCL_CONNECT_TIMEOUT`, `HCCL_EXEC_TIMEOUT`). Our `timeout` bounds the
//!   bootstrap rendezvous.
//! - `ReduceOp::Avg` has no HCCL op: reduce with `Sum` and scale (an error here, not a silent
//!   sum). Reductions take i32, i64, f32 and bf16 of our types on Atlas A2 (CANN's HcclAllReduce
//!   page; hccl.h's comment omits int64); u8, u32 and f64 reductions fail with HCCL's
//!   `HCCL_E_NOT_SUPPORT`. Data movement takes every type.
//! - The `_v` variants pad to the largest count (temporary buffers from the stream's allocator,
//!   one equal-count collective, device-to-device copies, then a stream sync before the
//!   temporaries are freed), since these bindings have no ReduceScatterV/AllGatherV. Prefer
//!   equal (padded) shards on the NPU, as FSDP2 does; equal counts take the direct path.
//! - `send_recv` orders its two halves by rank parity, which keeps rings deadlock-free on
//!   in-order streams (HcclBatchSendRecv is not bound).
//!
//! Files: `handle` (the communicator, its life and what every call shares), `bootstrap`
//! (making communicators), and this one, the collectives.

mod bootstrap;
mod handle;

use std::ffi::c_void;

use cannon_sys::hccl;

use super::error::{CommError, CommResult};
use super::types::ReduceOp;
use crate::buffer::{BufferView, BufferViewMut, DeviceBuffer};
use crate::dtype::Element;
use crate::stream::Stream;
pub(crate) use handle::HcclCommunicator;
use handle::{check, counts_displs, mut_ptr, runtime};

impl HcclCommunicator {
    /// `recv[i] = op over ranks of send[i]`. send, recv: (n,).
    pub(crate) fn all_reduce<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        op: ReduceOp,
        stream: &Stream,
    ) -> CommResult<()> {
        let what = "all_reduce";
        let op = self.reduce_code::<T>(what, op)?;
        self.check_len(what, "recv", recv.len(), send.len())?;
        self.check_devices(what, &[("send", send.device()), ("recv", recv.device())])?;
        let s = self.stream(what, stream)?;
        // SAFETY: both views are live device buffers of `n` values on this communicator's
        // device (checked above), borrowed until the call returns; HCCL reads/writes exactly n.
        check("HcclAllReduce", unsafe {
            hccl::HcclAllReduce(
                mut_ptr(send.as_raw_ptr()),
                recv.as_raw_mut_ptr().cast(),
                send.len() as u64,
                T::DTYPE.hccl_code(),
                op,
                self.raw,
                s,
            )
        })
    }

    /// `buf[i] = op over ranks of buf[i]`. buf: (n,).
    pub(crate) fn all_reduce_in_place<T: Element>(
        &self,
        buf: &mut BufferViewMut<'_, T>,
        op: ReduceOp,
        stream: &Stream,
    ) -> CommResult<()> {
        let what = "all_reduce";
        let op = self.reduce_code::<T>(what, op)?;
        self.check_devices(what, &[("buf", buf.device())])?;
        let s = self.stream(what, stream)?;
        let p = buf.as_raw_mut_ptr().cast::<c_void>();
        // SAFETY: as in `all_reduce`; HCCL supports send == recv for AllReduce.
        check("HcclAllReduce", unsafe {
            hccl::HcclAllReduce(
                p,
                p,
                buf.len() as u64,
                T::DTYPE.hccl_code(),
                op,
                self.raw,
                s,
            )
        })
    }

    /// Rank-major concatenation. send: (n,), recv: (world * n,).
    pub(crate) fn all_gather<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        stream: &Stream,
    ) -> CommResult<()> {
        let what = "all_gather";
        self.check_len(what, "recv", recv.len(), send.len() * self.world_size)?;
        self.check_devices(what, &[("send", send.device()), ("recv", recv.device())])?;
        let s = self.stream(what, stream)?;
        // SAFETY: live device views of n and world * n values on our device; HCCL takes the
        // per-rank send count (cann-api.md §5).
        check("HcclAllGather", unsafe {
            hccl::HcclAllGather(
                mut_ptr(send.as_raw_ptr()),
                recv.as_raw_mut_ptr().cast(),
                send.len() as u64,
                T::DTYPE.hccl_code(),
                self.raw,
                s,
            )
        })
    }

    /// send: (world * m,), recv: (m,). Uneven lengths: `CommError::NotDivisible`.
    pub(crate) fn reduce_scatter<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        op: ReduceOp,
        stream: &Stream,
    ) -> CommResult<()> {
        let what = "reduce_scatter";
        if !send.len().is_multiple_of(self.world_size) {
            return Err(CommError::NotDivisible {
                op: what,
                len: send.len(),
                world_size: self.world_size,
            });
        }
        let op = self.reduce_code::<T>(what, op)?;
        self.check_len(what, "recv", recv.len(), send.len() / self.world_size)?;
        self.check_devices(what, &[("send", send.device()), ("recv", recv.device())])?;
        let s = self.stream(what, stream)?;
        // SAFETY: live device views of world * m and m values; HCCL takes the per-rank recv
        // count (cann-api.md §5).
        check("HcclReduceScatter", unsafe {
            hccl::HcclReduceScatter(
                mut_ptr(send.as_raw_ptr()),
                recv.as_raw_mut_ptr().cast(),
                recv.len() as u64,
                T::DTYPE.hccl_code(),
                op,
                self.raw,
                s,
            )
        })
    }

    /// Copies `root`'s buf to every rank. buf: (n,).
    pub(crate) fn broadcast<T: Element>(
        &self,
        buf: &mut BufferViewMut<'_, T>,
        root: usize,
        stream: &Stream,
    ) -> CommResult<()> {
        let what = "broadcast";
        self.check_rank(what, root)?;
        self.check_devices(what, &[("buf", buf.device())])?;
        let s = self.stream(what, stream)?;
        // SAFETY: a live device view of n values on our device.
        check("HcclBroadcast", unsafe {
            hccl::HcclBroadcast(
                buf.as_raw_mut_ptr().cast(),
                buf.len() as u64,
                T::DTYPE.hccl_code(),
                root as u32,
                self.raw,
                s,
            )
        })
    }

    /// Equal-chunk all-to-all. send, recv: (world * c,).
    pub(crate) fn all_to_all<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        stream: &Stream,
    ) -> CommResult<()> {
        let what = "all_to_all";
        if !send.len().is_multiple_of(self.world_size) {
            return Err(CommError::NotDivisible {
                op: what,
                len: send.len(),
                world_size: self.world_size,
            });
        }
        self.check_len(what, "recv", recv.len(), send.len())?;
        self.check_devices(what, &[("send", send.device()), ("recv", recv.device())])?;
        let s = self.stream(what, stream)?;
        let chunk = (send.len() / self.world_size) as u64;
        let dt = T::DTYPE.hccl_code();
        // SAFETY: live device views of world * chunk values each (recvBuf is declared const in
        // the header but written, cann-api.md §5).
        check("HcclAlltoAll", unsafe {
            hccl::HcclAlltoAll(
                send.as_raw_ptr().cast(),
                chunk,
                dt,
                recv.as_raw_mut_ptr().cast_const().cast(),
                chunk,
                dt,
                self.raw,
                s,
            )
        })
    }

    /// All-to-all with per-peer counts, packed in rank order (as on the CPU).
    pub(crate) fn all_to_all_v<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        send_counts: &[usize],
        recv: &mut BufferViewMut<'_, T>,
        recv_counts: &[usize],
        stream: &Stream,
    ) -> CommResult<()> {
        let what = "all_to_all_v";
        self.check_len(what, "send_counts", send_counts.len(), self.world_size)?;
        self.check_len(what, "recv_counts", recv_counts.len(), self.world_size)?;
        self.check_len(what, "send", send.len(), send_counts.iter().sum())?;
        self.check_len(what, "recv", recv.len(), recv_counts.iter().sum())?;
        self.check_devices(what, &[("send", send.device()), ("recv", recv.device())])?;
        let s = self.stream(what, stream)?;
        // Host uint64 arrays in elements (cann-api.md §5); alive until the call returns.
        let (sc, sd) = counts_displs(send_counts);
        let (rc, rd) = counts_displs(recv_counts);
        let dt = T::DTYPE.hccl_code();
        // SAFETY: device views sized by the counts (checked above); the four host arrays hold
        // world_size u64 each and outlive the call.
        check("HcclAlltoAllV", unsafe {
            hccl::HcclAlltoAllV(
                send.as_raw_ptr().cast(),
                sc.as_ptr().cast(),
                sd.as_ptr().cast(),
                dt,
                recv.as_raw_mut_ptr().cast_const().cast(),
                rc.as_ptr().cast(),
                rd.as_ptr().cast(),
                dt,
                self.raw,
                s,
            )
        })
    }

    /// Sends `buf` to `dst` (matched in order by `recv` on `dst`).
    pub(crate) fn send<T: Element>(
        &self,
        buf: &BufferView<'_, T>,
        dst: usize,
        stream: &Stream,
    ) -> CommResult<()> {
        let what = "send";
        self.check_rank(what, dst)?;
        self.check_devices(what, &[("buf", buf.device())])?;
        let s = self.stream(what, stream)?;
        // SAFETY: a live device view of n values on our device.
        check("HcclSend", unsafe {
            hccl::HcclSend(
                mut_ptr(buf.as_raw_ptr()),
                buf.len() as u64,
                T::DTYPE.hccl_code(),
                dst as u32,
                self.raw,
                s,
            )
        })
    }

    /// Receives `buf.len()` values from `src`.
    pub(crate) fn recv<T: Element>(
        &self,
        buf: &mut BufferViewMut<'_, T>,
        src: usize,
        stream: &Stream,
    ) -> CommResult<()> {
        let what = "recv";
        self.check_rank(what, src)?;
        self.check_devices(what, &[("buf", buf.device())])?;
        let s = self.stream(what, stream)?;
        // SAFETY: a live device view of n values on our device.
        check("HcclRecv", unsafe {
            hccl::HcclRecv(
                buf.as_raw_mut_ptr().cast(),
                buf.len() as u64,
                T::DTYPE.hccl_code(),
                src as u32,
                self.raw,
                s,
            )
        })
    }

    /// Sends to `dst` and receives from `src`; even ranks send first, odd ranks receive
    /// first, so a ring on in-order streams has no cycle of waiting sends.
    pub(crate) fn send_recv<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        dst: usize,
        recv: &mut BufferViewMut<'_, T>,
        src: usize,
        stream: &Stream,
    ) -> CommResult<()> {
        if self.world_size == 1 {
            // Only ourselves to talk to: HCCL has no self-send; a device copy is the exchange.
            self.check_rank("send_recv", dst.max(src))?;
            return recv
                .memcpy_dtod(stream, send)
                .map_err(runtime("send_recv (memcpy_dtod)"));
        }
        if self.rank.is_multiple_of(2) {
            self.send(send, dst, stream)?;
            self.recv(recv, src, stream)
        } else {
            self.recv(recv, src, stream)?;
            self.send(send, dst, stream)
        }
    }

    /// Returns once every rank reached the barrier (HcclBarrier, then a stream sync).
    pub(crate) fn barrier(&self, stream: &Stream) -> CommResult<()> {
        let s = self.stream("barrier", stream)?;
        // SAFETY: live communicator and stream.
        check("HcclBarrier", unsafe { hccl::HcclBarrier(self.raw, s) })?;
        stream
            .synchronize()
            .map_err(runtime("barrier (synchronize)"))
    }

    /// Uneven all_gather through one padded all_gather. counts: (world,), send: (counts[rank],),
    /// recv: (sum counts,).
    pub(crate) fn all_gather_v<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        counts: &[usize],
        stream: &Stream,
    ) -> CommResult<()> {
        let what = "all_gather_v";
        self.check_len(what, "counts", counts.len(), self.world_size)?;
        self.check_len(what, "send", send.len(), counts[self.rank])?;
        self.check_len(what, "recv", recv.len(), counts.iter().sum())?;
        let max = counts.iter().copied().max().unwrap_or(0);
        if counts.iter().all(|&c| c == max) {
            return self.all_gather(send, recv, stream);
        }
        let err = runtime(what);
        let mut padded_send = DeviceBuffer::<T>::alloc_zeros(stream, max).map_err(&err)?;
        let mut gathered = DeviceBuffer::<T>::alloc(stream, max * self.world_size).map_err(&err)?;
        {
            let mut head = padded_send.slice_mut(0..send.len()).map_err(&err)?;
            head.memcpy_dtod(stream, send).map_err(&err)?;
        }
        self.all_gather(&padded_send.view(), &mut gathered.view_mut(), stream)?;
        let mut off = 0;
        for (j, &c) in counts.iter().enumerate() {
            let src = gathered.slice(j * max..j * max + c).map_err(&err)?;
            let mut dst = recv.slice_mut(off..off + c).map_err(&err)?;
            dst.memcpy_dtod(stream, &src).map_err(&err)?;
            off += c;
        }
        // The caching allocator does not track streams: the temporaries may be freed only
        // once the work that uses them is done.
        stream.synchronize().map_err(&err)
    }

    /// Uneven reduce_scatter through one padded reduce_scatter. counts: (world,), send:
    /// (sum counts,), recv: (counts[rank],).
    pub(crate) fn reduce_scatter_v<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        counts: &[usize],
        op: ReduceOp,
        stream: &Stream,
    ) -> CommResult<()> {
        let what = "reduce_scatter_v";
        self.reduce_code::<T>(what, op)?;
        self.check_len(what, "counts", counts.len(), self.world_size)?;
        self.check_len(what, "send", send.len(), counts.iter().sum())?;
        self.check_len(what, "recv", recv.len(), counts[self.rank])?;
        let max = counts.iter().copied().max().unwrap_or(0);
        if counts.iter().all(|&c| c == max) {
            return self.reduce_scatter(send, recv, op, stream);
        }
        let err = runtime(what);
        // Zero padding: it is reduced like data but never copied out, so any op is fine.
        let mut padded =
            DeviceBuffer::<T>::alloc_zeros(stream, max * self.world_size).map_err(&err)?;
        let mut off = 0;
        for (j, &c) in counts.iter().enumerate() {
            let src = send.slice(off..off + c).map_err(&err)?;
            let mut dst = padded.slice_mut(j * max..j * max + c).map_err(&err)?;
            dst.memcpy_dtod(stream, &src).map_err(&err)?;
            off += c;
        }
        let mut shard = DeviceBuffer::<T>::alloc(stream, max).map_err(&err)?;
        self.reduce_scatter(&padded.view(), &mut shard.view_mut(), op, stream)?;
        let src = shard.slice(0..recv.len()).map_err(&err)?;
        recv.memcpy_dtod(stream, &src).map_err(&err)?;
        // As in all_gather_v: the temporaries outlive the work that uses them.
        stream.synchronize().map_err(&err)
    }
}
