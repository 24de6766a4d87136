//! The in-process communicator: ranks are threads of one process, collectives read peers'
//! buffers directly (group.rs: the round protocol; exec.rs: the copies and reductions).
//!
//! It serves [`Communicator`](super::Communicator)'s calls on host buffers: every buffer and
//! the stream must be on the CPU (anything else is [`CommError::DeviceMismatch`], which fails
//! the group like any bad argument), the host slices are borrowed from the views, and the work
//! runs on the calling thread, so it is complete when the call returns, as on a CPU stream.

mod desc;
mod exec;
mod group;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::error::{CommError, CommResult};
use super::types::ReduceOp;
use crate::buffer::{BufferView, BufferViewMut};
use crate::device::Device;
use crate::dtype::Element;
use crate::stream::Stream;
use desc::{OpDesc, OpKind};
pub use exec::even_counts;
use exec::RawBufs;
use group::{Group, Message, Post};

/// Creates the communicators of an in-process world.
pub struct CpuWorld;

impl CpuWorld {
    /// One communicator per rank (index = rank), each to be moved into its own thread.
    /// `timeout` bounds every wait for peers; change it per communicator with
    /// [`Communicator::set_timeout`](super::Communicator::set_timeout) or per call with
    /// [`Communicator::with_timeout`](super::Communicator::with_timeout).
    // `CpuWorld` is only a namespace: what a world is, to the caller, is its communicators.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(world_size: usize, timeout: Duration) -> CommResult<Vec<super::Communicator>> {
        if world_size == 0 {
            return Err(CommError::InvalidArgument {
                op: "CpuWorld::new",
                detail: "a world needs at least one rank".into(),
            });
        }
        let group = Group::new(world_size);
        Ok((0..world_size)
            .map(|rank| CpuCommunicator::new(group.clone(), rank, timeout).into())
            .collect())
    }
}

/// One rank's handle on a group of in-process ranks.
///
/// `Send` (move it into the rank's thread) but not `Sync` or `Clone`: a rank issues its calls in
/// order from one place, as with HCCL. Dropping it tells the peers that this rank is gone, so
/// their pending and future collectives fail at once instead of waiting for the timeout.
pub(crate) struct CpuCommunicator {
    group: Arc<Group>,
    rank: usize,
    timeout: Cell<Duration>,
    /// Collectives this rank has called on this group (failed ones included): the round it
    /// takes part in next.
    seq: Cell<u64>,
}

impl Drop for CpuCommunicator {
    fn drop(&mut self) {
        self.group.mark_dropped(self.rank);
    }
}

impl std::fmt::Debug for CpuCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuCommunicator")
            .field("rank", &self.rank)
            .field("world_size", &self.group.size())
            .field("timeout", &self.timeout.get())
            .finish()
    }
}

impl CpuCommunicator {
    fn new(group: Arc<Group>, rank: usize, timeout: Duration) -> Self {
        CpuCommunicator {
            group,
            rank,
            timeout: Cell::new(timeout),
            seq: Cell::new(0),
        }
    }

    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    pub(crate) fn world_size(&self) -> usize {
        self.group.size()
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout.get()
    }

    pub(crate) fn set_timeout(&self, timeout: Duration) {
        self.timeout.set(timeout);
    }

    // The calls of `super::Communicator` on host buffers: check that the stream and buffers
    // are the CPU's, borrow the host slices, run the slice-level call below. Shapes and
    // semantics are documented on `super::Communicator`.

    pub(crate) fn all_reduce<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        op: ReduceOp,
        stream: &Stream,
    ) -> CommResult<()> {
        let (send, recv) = self.host_pair("all_reduce", true, send, recv, stream)?;
        self.all_reduce_host(send, recv, op)
    }

    pub(crate) fn all_reduce_in_place<T: Element>(
        &self,
        buf: &mut BufferViewMut<'_, T>,
        op: ReduceOp,
        stream: &Stream,
    ) -> CommResult<()> {
        const OP: &str = "all_reduce";
        self.on_host(OP, true, stream, &[("buf", buf.device())])?;
        self.all_reduce_in_place_host(buf.as_host_slice_mut().map_err(host(OP))?, op)
    }

    pub(crate) fn all_gather<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        stream: &Stream,
    ) -> CommResult<()> {
        let (send, recv) = self.host_pair("all_gather", true, send, recv, stream)?;
        self.all_gather_host(send, recv)
    }

    pub(crate) fn all_gather_v<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        counts: &[usize],
        stream: &Stream,
    ) -> CommResult<()> {
        let (send, recv) = self.host_pair("all_gather_v", true, send, recv, stream)?;
        self.all_gather_v_host(send, recv, counts)
    }

    pub(crate) fn reduce_scatter<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        op: ReduceOp,
        stream: &Stream,
    ) -> CommResult<()> {
        let (send, recv) = self.host_pair("reduce_scatter", true, send, recv, stream)?;
        self.reduce_scatter_host(send, recv, op)
    }

    pub(crate) fn reduce_scatter_v<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        counts: &[usize],
        op: ReduceOp,
        stream: &Stream,
    ) -> CommResult<()> {
        let (send, recv) = self.host_pair("reduce_scatter_v", true, send, recv, stream)?;
        self.reduce_scatter_v_host(send, recv, counts, op)
    }

    pub(crate) fn broadcast<T: Element>(
        &self,
        buf: &mut BufferViewMut<'_, T>,
        root: usize,
        stream: &Stream,
    ) -> CommResult<()> {
        const OP: &str = "broadcast";
        self.on_host(OP, true, stream, &[("buf", buf.device())])?;
        self.broadcast_host(buf.as_host_slice_mut().map_err(host(OP))?, root)
    }

    pub(crate) fn all_to_all<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        stream: &Stream,
    ) -> CommResult<()> {
        let (send, recv) = self.host_pair("all_to_all", true, send, recv, stream)?;
        self.all_to_all_host(send, recv)
    }

    pub(crate) fn all_to_all_v<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        send_counts: &[usize],
        recv: &mut BufferViewMut<'_, T>,
        recv_counts: &[usize],
        stream: &Stream,
    ) -> CommResult<()> {
        let (send, recv) = self.host_pair("all_to_all_v", true, send, recv, stream)?;
        self.all_to_all_v_host(send, send_counts, recv, recv_counts)
    }

    pub(crate) fn barrier(&self, stream: &Stream) -> CommResult<()> {
        self.on_host("barrier", true, stream, &[])?;
        self.barrier_host()
    }

    pub(crate) fn send<T: Element>(
        &self,
        buf: &BufferView<'_, T>,
        dst: usize,
        stream: &Stream,
    ) -> CommResult<()> {
        const OP: &str = "send";
        self.on_host(OP, false, stream, &[("buf", buf.device())])?;
        self.send_host(buf.as_host_slice().map_err(host(OP))?, dst)
    }

    pub(crate) fn recv<T: Element>(
        &self,
        buf: &mut BufferViewMut<'_, T>,
        src: usize,
        stream: &Stream,
    ) -> CommResult<()> {
        const OP: &str = "recv";
        self.on_host(OP, false, stream, &[("buf", buf.device())])?;
        self.recv_host(buf.as_host_slice_mut().map_err(host(OP))?, src)
    }

    /// `send` then `recv`: sends are eager, so a ring of these cannot deadlock.
    pub(crate) fn send_recv<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        dst: usize,
        recv: &mut BufferViewMut<'_, T>,
        src: usize,
        stream: &Stream,
    ) -> CommResult<()> {
        self.send(send, dst, stream)?;
        self.recv(recv, src, stream)
    }

    pub(crate) fn split(&self, color: u32, key: u32, stream: &Stream) -> CommResult<Self> {
        self.on_host("split", true, stream, &[])?;
        self.split_host(color, key)
    }

    /// Checks that the stream and every buffer are on the CPU. A mismatch is this rank's own
    /// mistake and fails the group like a bad length (`collective`: as this rank's call), so
    /// peers learn of it at once instead of waiting for the timeout.
    /// The host slices of a send/recv pair, once [`Self::on_host`] has checked that both
    /// and the stream are on the host.
    fn host_pair<'s, 'r, T: Element>(
        &self,
        op: &'static str,
        collective: bool,
        send: &'s BufferView<'_, T>,
        recv: &'r mut BufferViewMut<'_, T>,
        stream: &Stream,
    ) -> CommResult<(&'s [T], &'r mut [T])> {
        let bufs = [("send", send.device()), ("recv", recv.device())];
        self.on_host(op, collective, stream, &bufs)?;
        let send = send.as_host_slice().map_err(host(op))?;
        Ok((send, recv.as_host_slice_mut().map_err(host(op))?))
    }

    fn on_host(
        &self,
        op: &'static str,
        collective: bool,
        stream: &Stream,
        bufs: &[(&'static str, Device)],
    ) -> CommResult<()> {
        let all = std::iter::once(("the stream", stream.device())).chain(bufs.iter().copied());
        for (what, found) in all {
            if found != Device::Cpu {
                let e = CommError::DeviceMismatch {
                    op,
                    rank: self.rank,
                    what,
                    expected: Device::Cpu,
                    found,
                };
                return Err(self.reject(collective, e));
            }
        }
        Ok(())
    }

    /// `recv[i] = op over ranks of send[i]`. send: (n,), recv: (n,) on every rank.
    fn all_reduce_host<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> CommResult<()> {
        let d = self.reduce_desc::<T>(OpKind::AllReduce, op, send.len())?;
        self.check_len(d.kind, "recv", recv.len(), send.len())?;
        self.run::<T>(d, RawBufs::new(send, recv))
    }

    /// `buf[i] = op over ranks of buf[i]`. buf: (n,).
    fn all_reduce_in_place_host<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> CommResult<()> {
        let d = self.reduce_desc::<T>(OpKind::AllReduce, op, buf.len())?;
        self.run::<T>(d, RawBufs::in_place(buf))
    }

    /// Rank-major concatenation. send: (n,), recv: (world * n,), recv[r*n..(r+1)*n] = rank r's.
    fn all_gather_host<T: Element>(&self, send: &[T], recv: &mut [T]) -> CommResult<()> {
        let d = self.data_desc::<T>(OpKind::AllGather, send.len());
        self.check_len(d.kind, "recv", recv.len(), send.len() * self.world_size())?;
        self.run::<T>(d, RawBufs::new(send, recv))
    }

    /// Uneven all_gather (FSDP flat shards). counts: (world,) identical on all ranks;
    /// send: (counts[rank],), recv: (sum counts,), packed in rank order.
    fn all_gather_v_host<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
    ) -> CommResult<()> {
        let mut d = self.data_desc::<T>(OpKind::AllGatherV, 0);
        self.check_counts(d.kind, counts)?;
        self.check_len(d.kind, "send", send.len(), counts[self.rank])?;
        self.check_len(d.kind, "recv", recv.len(), counts.iter().sum())?;
        d.counts = counts.to_vec();
        self.run::<T>(d, RawBufs::new(send, recv))
    }

    /// send: (world * m,), recv: (m,) = op over ranks of their send[rank*m..(rank+1)*m].
    /// A send length that does not split evenly is `CommError::NotDivisible` (use the _v form).
    fn reduce_scatter_host<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> CommResult<()> {
        let world = self.world_size();
        if !send.len().is_multiple_of(world) {
            let e = CommError::NotDivisible {
                op: "reduce_scatter",
                len: send.len(),
                world_size: world,
            };
            return Err(self.reject(true, e));
        }
        let d = self.reduce_desc::<T>(OpKind::ReduceScatter, op, send.len() / world)?;
        self.check_len(d.kind, "recv", recv.len(), send.len() / world)?;
        self.run::<T>(d, RawBufs::new(send, recv))
    }

    /// Uneven reduce_scatter (FSDP gradient shards). counts: (world,) identical on all ranks;
    /// send: (sum counts,) packed in rank order, recv: (counts[rank],).
    fn reduce_scatter_v_host<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: ReduceOp,
    ) -> CommResult<()> {
        let mut d = self.reduce_desc::<T>(OpKind::ReduceScatterV, op, 0)?;
        self.check_counts(d.kind, counts)?;
        self.check_len(d.kind, "send", send.len(), counts.iter().sum())?;
        self.check_len(d.kind, "recv", recv.len(), counts[self.rank])?;
        d.counts = counts.to_vec();
        self.run::<T>(d, RawBufs::new(send, recv))
    }

    /// Copies `root`'s buf into every other rank's buf. buf: (n,) on every rank.
    fn broadcast_host<T: Element>(&self, buf: &mut [T], root: usize) -> CommResult<()> {
        let mut d = self.data_desc::<T>(OpKind::Broadcast, buf.len());
        self.check_rank(d.kind.name(), true, root)?;
        d.root = Some(root);
        self.run::<T>(d, RawBufs::in_place(buf))
    }

    /// Equal-chunk all-to-all. send, recv: (world * c,); rank r's recv chunk j is rank j's send
    /// chunk r.
    fn all_to_all_host<T: Element>(&self, send: &[T], recv: &mut [T]) -> CommResult<()> {
        let world = self.world_size();
        if !send.len().is_multiple_of(world) {
            let e = CommError::NotDivisible {
                op: "all_to_all",
                len: send.len(),
                world_size: world,
            };
            return Err(self.reject(true, e));
        }
        let d = self.data_desc::<T>(OpKind::AllToAll, send.len() / world);
        self.check_len(d.kind, "recv", recv.len(), send.len())?;
        self.run::<T>(d, RawBufs::new(send, recv))
    }

    /// All-to-all with per-peer counts, chunks packed in rank order (displacements are the
    /// prefix sums of the counts). send_counts[j]: elements for rank j, recv_counts[j]: from
    /// rank j; rank i's send_counts[j] must equal rank j's recv_counts[i].
    fn all_to_all_v_host<T: Element>(
        &self,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> CommResult<()> {
        let mut d = self.data_desc::<T>(OpKind::AllToAllV, 0);
        self.check_counts(d.kind, send_counts)?;
        self.check_counts(d.kind, recv_counts)?;
        self.check_len(d.kind, "send", send.len(), send_counts.iter().sum())?;
        self.check_len(d.kind, "recv", recv.len(), recv_counts.iter().sum())?;
        d.counts = send_counts.to_vec();
        d.recv_counts = recv_counts.to_vec();
        self.run::<T>(d, RawBufs::new(send, recv))
    }

    /// Returns once every rank of the group called `barrier`.
    fn barrier_host(&self) -> CommResult<()> {
        self.enter(OpDesc::new(OpKind::Barrier), RawBufs::none())?;
        self.group.stage(true);
        Ok(())
    }

    /// Sends `buf` to `dst`. Eager: the data is copied and the call returns at once, so a ring
    /// (send to the next rank, then receive from the previous one) cannot deadlock. Messages
    /// from one rank to another are received in the order they were sent.
    fn send_host<T: Element>(&self, buf: &[T], dst: usize) -> CommResult<()> {
        self.check_rank("send", false, dst)?;
        let msg = Message {
            dtype: T::DTYPE,
            len: buf.len(),
            bytes: bytemuck::cast_slice(buf).to_vec(),
        };
        self.group.push_message(self.rank, dst, msg)
    }

    /// Receives the oldest unreceived message from `src`, which must have `buf.len()` elements
    /// of type `T` (anything else is `CommError::Mismatch`).
    fn recv_host<T: Element>(&self, buf: &mut [T], src: usize) -> CommResult<()> {
        self.check_rank("recv", false, src)?;
        let msg = self
            .group
            .pop_message(src, self.rank, T::DTYPE, buf.len(), self.timeout())?;
        bytemuck::cast_slice_mut::<T, u8>(buf).copy_from_slice(&msg.bytes);
        Ok(())
    }

    /// Splits the group like `MPI_Comm_split`: ranks with the same `color` form a new group,
    /// ordered by `(key, old rank)`. Collective over this group; the new communicator inherits
    /// this one's timeout.
    fn split_host(&self, color: u32, key: u32) -> CommResult<CpuCommunicator> {
        let mut d = OpDesc::new(OpKind::Split);
        d.split = Some((color, key));
        let round = self.enter(d, RawBufs::none())?;
        let out = round.split_out.get(self.rank).map(|(g, r)| (g.clone(), *r));
        self.group.stage(true);
        let (group, rank) = out.ok_or_else(|| CommError::InvalidArgument {
            op: "split",
            detail: format!("rank {} got no group from the split", self.rank),
        })?;
        Ok(CpuCommunicator::new(group, rank, self.timeout()))
    }

    fn run<T: Element>(&self, desc: OpDesc, bufs: RawBufs) -> CommResult<()> {
        let round = self.enter(desc, bufs)?;
        exec::execute::<T>(&self.group, &round, self.rank);
        Ok(())
    }

    fn enter(&self, desc: OpDesc, bufs: RawBufs) -> CommResult<Arc<group::Round>> {
        let seq = self.next_seq();
        let post = Post { desc, bufs };
        self.group
            .enter(self.rank, seq, post, self.timeout(), build_split)
    }

    fn data_desc<T: Element>(&self, kind: OpKind, count: usize) -> OpDesc {
        let mut d = OpDesc::new(kind);
        d.dtype = Some(T::DTYPE);
        d.count = count;
        d
    }

    fn reduce_desc<T: Element>(
        &self,
        kind: OpKind,
        op: ReduceOp,
        count: usize,
    ) -> CommResult<OpDesc> {
        op.check(kind.name(), T::DTYPE)
            .map_err(|e| self.reject(true, e))?;
        let mut d = self.data_desc::<T>(kind, count);
        d.reduce = Some(op);
        Ok(d)
    }

    fn check_len(&self, kind: OpKind, what: &str, got: usize, want: usize) -> CommResult<()> {
        if got == want {
            return Ok(());
        }
        let e = CommError::InvalidArgument {
            op: kind.name(),
            detail: format!(
                "rank {}: {what} has {got} elements, expected {want}",
                self.rank
            ),
        };
        Err(self.reject(true, e))
    }

    fn check_counts(&self, kind: OpKind, counts: &[usize]) -> CommResult<()> {
        self.check_len(kind, "the counts array", counts.len(), self.world_size())
    }

    fn check_rank(&self, op: &'static str, collective: bool, rank: usize) -> CommResult<()> {
        if rank < self.world_size() {
            return Ok(());
        }
        let e = CommError::InvalidRank {
            op,
            rank,
            world_size: self.world_size(),
        };
        Err(self.reject(collective, e))
    }

    /// Fails the group for an error found on this rank alone. A collective's failure still
    /// counts as this rank's call, so its next collective is judged as the next round.
    fn reject(&self, collective: bool, e: CommError) -> CommError {
        let seq = collective.then(|| self.next_seq());
        self.group.fail_local(seq, e)
    }

    fn next_seq(&self) -> u64 {
        let s = self.seq.get();
        self.seq.set(s + 1);
        s
    }
}

/// Borrowing the host slice of a view that `on_host` accepted cannot fail; should it, the
/// runtime's error is passed on rather than unwrapped.
fn host(op: &'static str) -> impl Fn(crate::Error) -> CommError {
    move |e| CommError::Runtime {
        call: op,
        message: e.to_string(),
    }
}

/// Builds the groups of a split (run once, by the rank that completes the posting).
fn build_split(posts: &[Post]) -> Vec<(Arc<Group>, usize)> {
    let mut by_color: BTreeMap<u32, Vec<(u32, usize)>> = BTreeMap::new();
    for (old, p) in posts.iter().enumerate() {
        let (color, key) = p.desc.split.unwrap_or((0, 0));
        by_color.entry(color).or_default().push((key, old));
    }
    let mut out: Vec<Option<(Arc<Group>, usize)>> = (0..posts.len()).map(|_| None).collect();
    for mut members in by_color.into_values() {
        members.sort_unstable();
        let group = Group::new(members.len());
        for (new, &(_, old)) in members.iter().enumerate() {
            out[old] = Some((group.clone(), new));
        }
    }
    out.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer on another device is a typed error on the rank that passed it, and fails the
    /// group so that its peers do not wait for it. (Without an NPU no such buffer can be
    /// made, so the check is driven with the device it would report.)
    #[test]
    fn a_buffer_on_another_device_fails_the_group() {
        let group = Group::new(2);
        let a = CpuCommunicator::new(group.clone(), 0, Duration::from_secs(20));
        let b = CpuCommunicator::new(group, 1, Duration::from_secs(20));
        let stream = Stream::cpu();
        let e = a
            .on_host("all_reduce", true, &stream, &[("recv", Device::Npu(1))])
            .unwrap_err();
        assert_eq!(
            e,
            CommError::DeviceMismatch {
                op: "all_reduce",
                rank: 0,
                what: "recv",
                expected: Device::Cpu,
                found: Device::Npu(1),
            }
        );
        assert_eq!(
            e.to_string(),
            "all_reduce: rank 0: recv is on npu:1, the communicator is on cpu"
        );
        let t = std::time::Instant::now();
        // The peer's call is the same round, so it fails with the cause itself; the next one
        // finds the group poisoned.
        let same_round = b.barrier(&stream).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        assert_eq!(same_round, e);
        let after = b.barrier(&stream).unwrap_err();
        assert!(
            matches!(&after, CommError::Poisoned { cause, .. } if cause.contains("npu:1")),
            "{after}"
        );
    }
}
