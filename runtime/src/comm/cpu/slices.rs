//! The collectives on host slices (or, on the meta device, on lengths alone): each checks
//! its arguments against the group's size, describes its round and runs it.

use super::super::error::{CommError, CommResult};
use super::super::types::ReduceOp;
use super::bufs::RawBufs;
use super::desc::{OpDesc, OpKind};
use super::group::Message;
use super::rank::CpuCommunicator;
use crate::dtype::Element;

/// A send/receive pair as a round sees it: the lengths, and the memory peers read and write
/// (none on the meta device).
pub(super) struct Pair {
    pub(super) send: usize,
    pub(super) recv: usize,
    pub(super) bufs: RawBufs,
}

impl CpuCommunicator {
    /// `recv[i] = op over ranks of send[i]`. send: (n,), recv: (n,) on every rank.
    pub(super) fn all_reduce_host<T: Element>(&self, p: Pair, op: ReduceOp) -> CommResult<()> {
        let d = self.reduce_desc::<T>(OpKind::AllReduce, op, p.send)?;
        self.check_len(d.kind, "recv", p.recv, p.send)?;
        self.run::<T>(d, p.bufs)
    }

    /// `buf[i] = op over ranks of buf[i]`. buf: (n,).
    pub(super) fn all_reduce_in_place_host<T: Element>(
        &self,
        len: usize,
        bufs: RawBufs,
        op: ReduceOp,
    ) -> CommResult<()> {
        let d = self.reduce_desc::<T>(OpKind::AllReduce, op, len)?;
        self.run::<T>(d, bufs)
    }

    /// Rank-major concatenation. send: (n,), recv: (world * n,), recv[r*n..(r+1)*n] = rank r's.
    pub(super) fn all_gather_host<T: Element>(&self, p: Pair) -> CommResult<()> {
        let d = self.data_desc::<T>(OpKind::AllGather, p.send);
        self.check_len(d.kind, "recv", p.recv, p.send * self.world_size())?;
        self.run::<T>(d, p.bufs)
    }

    /// Uneven all_gather (FSDP flat shards). counts: (world,) identical on all ranks;
    /// send: (counts[rank],), recv: (sum counts,), packed in rank order.
    pub(super) fn all_gather_v_host<T: Element>(
        &self,
        p: Pair,
        counts: &[usize],
    ) -> CommResult<()> {
        let mut d = self.data_desc::<T>(OpKind::AllGatherV, 0);
        self.check_counts(d.kind, counts)?;
        self.check_len(d.kind, "send", p.send, counts[self.rank])?;
        self.check_len(d.kind, "recv", p.recv, counts.iter().sum())?;
        d.counts = counts.to_vec();
        self.run::<T>(d, p.bufs)
    }

    /// send: (world * m,), recv: (m,) = op over ranks of their send[rank*m..(rank+1)*m].
    /// A send length that does not split evenly is `CommError::NotDivisible` (use the _v form).
    pub(super) fn reduce_scatter_host<T: Element>(&self, p: Pair, op: ReduceOp) -> CommResult<()> {
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
    pub(super) fn reduce_scatter_v_host<T: Element>(
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
    pub(super) fn broadcast_host<T: Element>(
        &self,
        len: usize,
        bufs: RawBufs,
        root: usize,
    ) -> CommResult<()> {
        let mut d = self.data_desc::<T>(OpKind::Broadcast, len);
        self.check_rank(d.kind.name(), true, root)?;
        d.root = Some(root);
        self.run::<T>(d, bufs)
    }

    /// Equal-chunk all-to-all. send, recv: (world * c,); rank r's recv chunk j is rank j's send
    /// chunk r.
    pub(super) fn all_to_all_host<T: Element>(&self, p: Pair) -> CommResult<()> {
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
    pub(super) fn all_to_all_v_host<T: Element>(
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
    pub(super) fn barrier_host(&self) -> CommResult<()> {
        self.enter(OpDesc::new(OpKind::Barrier), RawBufs::none())?;
        self.group.stage(true);
        Ok(())
    }

    /// Sends `buf` to `dst`. Eager: the data is copied and the call returns at once, so a ring
    /// (send to the next rank, then receive from the previous one) cannot deadlock. Messages
    /// from one rank to another are received in the order they were sent.
    /// (`bytes`: the buffer's, none on the meta device.)
    pub(super) fn send_host<T: Element>(
        &self,
        len: usize,
        bytes: Vec<u8>,
        dst: usize,
    ) -> CommResult<()> {
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
    pub(super) fn recv_host<T: Element>(&self, len: usize, src: usize) -> CommResult<Message> {
        self.check_rank("recv", false, src)?;
        self.group
            .pop_message(src, self.rank, T::DTYPE, len, self.timeout())
    }

    /// Splits the group like `MPI_Comm_split`: ranks with the same `color` form a new group,
    /// ordered by `(key, old rank)`. Collective over this group; the new communicator inherits
    /// this one's timeout.
    pub(super) fn split_host(&self, color: u32, key: u32) -> CommResult<CpuCommunicator> {
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
}
