//! The in-process communicator: ranks are threads of one process, collectives read peers'
//! buffers directly (group.rs: the round protocol; exec.rs: the copies and reductions).
//!
//! It serves [`Communicator`](super::Communicator)'s calls on host buffers: every buffer and
//! the stream must be on the CPU (anything else is [`CommError::DeviceMismatch`], which fails
//! the group like any bad argument), the host slices are borrowed from the views, and the work
//! runs on the calling thread, so it is complete when the call returns, as on a CPU stream.
//!
//! A world of meta ranks ([`CpuWorld::meta`](super::CpuWorld::meta)) runs the same rounds
//! over buffers of [`Device::Meta`]: every call is checked locally and across ranks (lengths,
//! counts, dtypes, the call itself) and splits form the same groups, but no data moves.

mod bufs;
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
use bufs::RawBufs;
use desc::{OpDesc, OpKind};
pub use exec::even_counts;
use group::{Group, Message, Post};

/// The ranks of a new in-process world on `device` (the CPU, or the meta device), one per
/// rank; [`CpuWorld`](super::CpuWorld) wraps them into communicators.
pub(super) fn world(
    device: Device,
    world_size: usize,
    timeout: Duration,
) -> CommResult<Vec<CpuCommunicator>> {
    if world_size == 0 {
        return Err(CommError::InvalidArgument {
            op: "CpuWorld::new",
            detail: "a world needs at least one rank".into(),
        });
    }
    let group = Group::new(world_size);
    Ok((0..world_size)
        .map(|rank| CpuCommunicator::new(device, group.clone(), rank, timeout))
        .collect())
}

/// A send/receive pair as a round sees it: the lengths, and the memory peers read and write
/// (none on the meta device).
struct Pair {
    send: usize,
    recv: usize,
    bufs: RawBufs,
}

/// One rank's handle on a group of in-process ranks.
///
/// `Send` (move it into the rank's thread) but not `Sync` or `Clone`: a rank issues its calls in
/// order from one place, as with HCCL. Dropping it tells the peers that this rank is gone, so
/// their pending and future collectives fail at once instead of waiting for the timeout.
pub(crate) struct CpuCommunicator {
    /// The CPU, or the meta device (rounds without data).
    device: Device,
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
    fn new(device: Device, group: Arc<Group>, rank: usize, timeout: Duration) -> Self {
        CpuCommunicator {
            device,
            group,
            rank,
            timeout: Cell::new(timeout),
            seq: Cell::new(0),
        }
    }

    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    pub(crate) fn device(&self) -> Device {
        self.device
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
        let pair = self.pair("all_reduce", send, recv, stream)?;
        self.all_reduce_host::<T>(pair, op)
    }

    pub(crate) fn all_reduce_in_place<T: Element>(
        &self,
        buf: &mut BufferViewMut<'_, T>,
        op: ReduceOp,
        stream: &Stream,
    ) -> CommResult<()> {
        const OP: &str = "all_reduce";
        let (len, bufs) = self.in_place(OP, buf, stream)?;
        self.all_reduce_in_place_host::<T>(len, bufs, op)
    }

    pub(crate) fn all_gather<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        stream: &Stream,
    ) -> CommResult<()> {
        let pair = self.pair("all_gather", send, recv, stream)?;
        self.all_gather_host::<T>(pair)
    }

    pub(crate) fn all_gather_v<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        counts: &[usize],
        stream: &Stream,
    ) -> CommResult<()> {
        let pair = self.pair("all_gather_v", send, recv, stream)?;
        self.all_gather_v_host::<T>(pair, counts)
    }

    pub(crate) fn reduce_scatter<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        op: ReduceOp,
        stream: &Stream,
    ) -> CommResult<()> {
        let pair = self.pair("reduce_scatter", send, recv, stream)?;
        self.reduce_scatter_host::<T>(pair, op)
    }

    pub(crate) fn reduce_scatter_v<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        counts: &[usize],
        op: ReduceOp,
        stream: &Stream,
    ) -> CommResult<()> {
        let pair = self.pair("reduce_scatter_v", send, recv, stream)?;
        self.reduce_scatter_v_host::<T>(pair, counts, op)
    }

    pub(crate) fn broadcast<T: Element>(
        &self,
        buf: &mut BufferViewMut<'_, T>,
        root: usize,
        stream: &Stream,
    ) -> CommResult<()> {
        const OP: &str = "broadcast";
        let (len, bufs) = self.in_place(OP, buf, stream)?;
        self.broadcast_host::<T>(len, bufs, root)
    }

    pub(crate) fn all_to_all<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        stream: &Stream,
    ) -> CommResult<()> {
        let pair = self.pair("all_to_all", send, recv, stream)?;
        self.all_to_all_host::<T>(pair)
    }

    pub(crate) fn all_to_all_v<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        send_counts: &[usize],
        recv: &mut BufferViewMut<'_, T>,
        recv_counts: &[usize],
        stream: &Stream,
    ) -> CommResult<()> {
        let pair = self.pair("all_to_all_v", send, recv, stream)?;
        self.all_to_all_v_host::<T>(pair, send_counts, recv_counts)
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
        let bytes = match self.device.is_meta() {
            true => Vec::new(),
            false => bytemuck::cast_slice(buf.as_host_slice().map_err(host(OP))?).to_vec(),
        };
        self.send_host::<T>(buf.len(), bytes, dst)
    }

    pub(crate) fn recv<T: Element>(
        &self,
        buf: &mut BufferViewMut<'_, T>,
        src: usize,
        stream: &Stream,
    ) -> CommResult<()> {
        const OP: &str = "recv";
        self.on_host(OP, false, stream, &[("buf", buf.device())])?;
        let msg = self.recv_host::<T>(buf.len(), src)?;
        if !self.device.is_meta() {
            let buf = buf.as_host_slice_mut().map_err(host(OP))?;
            bytemuck::cast_slice_mut::<T, u8>(buf).copy_from_slice(&msg.bytes);
        }
        Ok(())
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

    /// The lengths and memory of a send/receive pair, once [`Self::on_host`] has checked
    /// that both and the stream are on this communicator's device (a collective: a mismatch
    /// fails the group).
    fn pair<T: Element>(
        &self,
        op: &'static str,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        stream: &Stream,
    ) -> CommResult<Pair> {
        let bufs = [("send", send.device()), ("recv", recv.device())];
        self.on_host(op, true, stream, &bufs)?;
        let (n, m) = (send.len(), recv.len());
        let bufs = match self.device.is_meta() {
            true => RawBufs::none(),
            false => {
                let send = send.as_host_slice().map_err(host(op))?;
                RawBufs::new(send, recv.as_host_slice_mut().map_err(host(op))?)
            }
        };
        Ok(Pair {
            send: n,
            recv: m,
            bufs,
        })
    }

    /// The length and memory of a buffer both sent and received (in-place all-reduce,
    /// broadcast), checked as [`Self::pair`] does.
    fn in_place<T: Element>(
        &self,
        op: &'static str,
        buf: &mut BufferViewMut<'_, T>,
        stream: &Stream,
    ) -> CommResult<(usize, RawBufs)> {
        self.on_host(op, true, stream, &[("buf", buf.device())])?;
        let len = buf.len();
        let bufs = match self.device.is_meta() {
            true => RawBufs::none(),
            false => RawBufs::in_place(buf.as_host_slice_mut().map_err(host(op))?),
        };
        Ok((len, bufs))
    }

    /// Checks that the stream and every buffer are on this communicator's device. A
    /// mismatch is this rank's own mistake and fails the group like a bad length
    /// (`collective`: as this rank's call), so peers learn of it at once instead of waiting
    /// for the timeout.
    fn on_host(
        &self,
        op: &'static str,
        collective: bool,
        stream: &Stream,
        bufs: &[(&'static str, Device)],
    ) -> CommResult<()> {
        let all = std::iter::once(("the stream", stream.device())).chain(bufs.iter().copied());
        for (what, found) in all {
            if found != self.device {
                let e = CommError::DeviceMismatch {
                    op,
                    rank: self.rank,
                    what,
                    expected: self.device,
                    found,
                };
                return Err(self.reject(collective, e));
            }
        }
        Ok(())
    }

    /// `recv[i] = op over ranks of send[i]`. send: (n,), recv: (n,) on every rank.
    fn all_reduce_host<T: Element>(&self, p: Pair, op: ReduceOp) -> CommResult<()> {
        let d = self.reduce_desc::<T>(OpKind::AllReduce, op, p.send)?;
        self.check_len(d.kind, "recv", p.recv, p.send)?;
        self.run::<T>(d, p.bufs)
    }

    /// `buf[i] = op over ranks of buf[i]`. buf: (n,).
    fn all_reduce_in_place_host<T: Element>(
        &self,
        len: usize,
        bufs: RawBufs,
        op: ReduceOp,
    ) -> CommResult<()> {
        let d = self.reduce_desc::<T>(OpKind::AllReduce, op, len)?;
        self.run::<T>(d, bufs)
    }

    /// Rank-major concatenation. send: (n,), recv: (world * n,), recv[r*n..(r+1)*n] = rank r's.
    fn all_gather_host<T: Element>(&self, p: Pair) -> CommResult<()> {
        let d = self.data_desc::<T>(OpKind::AllGather, p.send);
        self.check_len(d.kind, "recv", p.recv, p.send * self.world_size())?;
        self.run::<T>(d, p.bufs)
    }

    /// Uneven all_gather (FSDP flat shards). counts: (world,) identical on all ranks;
    /// send: (counts[rank],), recv: (sum counts,), packed in rank order.
    fn all_gather_v_host<T: Element>(&self, p: Pair, counts: &[usize]) -> CommResult<()> {
        let mut d = self.data_desc::<T>(OpKind::AllGatherV, 0);
        self.check_counts(d.kind, counts)?;
        self.check_len(d.kind, "send", p.send, counts[self.rank])?;
        self.check_len(d.kind, "recv", p.recv, counts.iter().sum())?;
        d.counts = counts.to_vec();
        self.run::<T>(d, p.bufs)
    }

    /// send: (world * m,), recv: (m,) = op over ranks of their send[rank*m..(rank+1)*m].
    /// A send length that does not split evenly is `CommError::NotDivisible` (use the _v form).
    fn reduce_scatter_host<T: Element>(&self, p: Pair, op: ReduceOp) -> CommResult<()> {
        let world = self.world_size();
        if !p.send.is_multiple_of(world) {
            let e = CommError::NotDivisible {
                op: "reduce_scatter",
                len: p.send,
                world_size: world,
            };
            return Err(self.reject(true, e));
        }
        let d = self.reduce_desc::<T>(OpKind::ReduceScatter, op, p.send / world)?;
        self.check_len(d.kind, "recv", p.recv, p.send / world)?;
        self.run::<T>(d, p.bufs)
    }

    /// Uneven reduce_scatter (FSDP gradient shards). counts: (world,) identical on all ranks;
    /// send: (sum counts,) packed in rank order, recv: (counts[rank],).
    fn reduce_scatter_v_host<T: Element>(
        &self,
        p: Pair,
        counts: &[usize],
        op: ReduceOp,
    ) -> CommResult<()> {
        let mut d = self.reduce_desc::<T>(OpKind::ReduceScatterV, op, 0)?;
        self.check_counts(d.kind, counts)?;
        self.check_len(d.kind, "send", p.send, counts.iter().sum())?;
        self.check_len(d.kind, "recv", p.recv, counts[self.rank])?;
        d.counts = counts.to_vec();
        self.run::<T>(d, p.bufs)
    }

    /// Copies `root`'s buf into every other rank's buf. buf: (n,) on every rank.
    fn broadcast_host<T: Element>(&self, len: usize, bufs: RawBufs, root: usize) -> CommResult<()> {
        let mut d = self.data_desc::<T>(OpKind::Broadcast, len);
        self.check_rank(d.kind.name(), true, root)?;
        d.root = Some(root);
        self.run::<T>(d, bufs)
    }

    /// Equal-chunk all-to-all. send, recv: (world * c,); rank r's recv chunk j is rank j's send
    /// chunk r.
    fn all_to_all_host<T: Element>(&self, p: Pair) -> CommResult<()> {
        let world = self.world_size();
        if !p.send.is_multiple_of(world) {
            let e = CommError::NotDivisible {
                op: "all_to_all",
                len: p.send,
                world_size: world,
            };
            return Err(self.reject(true, e));
        }
        let d = self.data_desc::<T>(OpKind::AllToAll, p.send / world);
        self.check_len(d.kind, "recv", p.recv, p.send)?;
        self.run::<T>(d, p.bufs)
    }

    /// All-to-all with per-peer counts, chunks packed in rank order (displacements are the
    /// prefix sums of the counts). send_counts[j]: elements for rank j, recv_counts[j]: from
    /// rank j; rank i's send_counts[j] must equal rank j's recv_counts[i].
    fn all_to_all_v_host<T: Element>(
        &self,
        p: Pair,
        send_counts: &[usize],
        recv_counts: &[usize],
    ) -> CommResult<()> {
        let mut d = self.data_desc::<T>(OpKind::AllToAllV, 0);
        self.check_counts(d.kind, send_counts)?;
        self.check_counts(d.kind, recv_counts)?;
        self.check_len(d.kind, "send", p.send, send_counts.iter().sum())?;
        self.check_len(d.kind, "recv", p.recv, recv_counts.iter().sum())?;
        d.counts = send_counts.to_vec();
        d.recv_counts = recv_counts.to_vec();
        self.run::<T>(d, p.bufs)
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
    /// (`bytes`: the buffer's, none on the meta device.)
    fn send_host<T: Element>(&self, len: usize, bytes: Vec<u8>, dst: usize) -> CommResult<()> {
        self.check_rank("send", false, dst)?;
        let msg = Message {
            dtype: T::DTYPE,
            len,
            bytes,
        };
        self.group.push_message(self.rank, dst, msg)
    }

    /// Receives the oldest unreceived message from `src`, which must have `buf.len()` elements
    /// of type `T` (anything else is `CommError::Mismatch`).
    /// (The caller copies the message's bytes into its buffer.)
    fn recv_host<T: Element>(&self, len: usize, src: usize) -> CommResult<Message> {
        self.check_rank("recv", false, src)?;
        self.group
            .pop_message(src, self.rank, T::DTYPE, len, self.timeout())
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
        Ok(CpuCommunicator::new(
            self.device,
            group,
            rank,
            self.timeout(),
        ))
    }

    fn run<T: Element>(&self, desc: OpDesc, bufs: RawBufs) -> CommResult<()> {
        let round = self.enter(desc, bufs)?;
        match self.device.is_meta() {
            // Checked locally and against the peers' calls (enter); nothing to move.
            true => self.group.stage(true),
            false => exec::execute::<T>(&self.group, &round, self.rank),
        }
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
mod tests;
