//! The in-process communicator: ranks are threads of one process, collectives read peers'
//! buffers directly (group.rs: the round protocol; exec.rs: the copies and reductions;
//! rank.rs: a rank's handle and what its calls share; slices.rs: the collectives on host
//! slices; this file: the calls on buffer views, checked and borrowed).
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
mod rank;
mod slices;

use std::time::Duration;

use super::error::{CommError, CommResult};
use super::types::ReduceOp;
use crate::buffer::{BufferView, BufferViewMut};
use crate::device::Device;
use crate::dtype::Element;
use crate::stream::Stream;
use bufs::RawBufs;
pub use exec::even_counts;
use group::Group;
pub(crate) use rank::CpuCommunicator;
use slices::Pair;

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

impl CpuCommunicator {
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
}

/// Borrowing the host slice of a view that `on_host` accepted cannot fail; should it, the
/// runtime's error is passed on rather than unwrapped.
fn host(op: &'static str) -> impl Fn(crate::Error) -> CommError {
    move |e| CommError::Runtime {
        call: op,
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests;
