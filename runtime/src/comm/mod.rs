//! Collective communication over device buffers, dtype-generic and counted in elements.
//!
//! [`Communicator`] is the one interface: every collective takes [`BufferView`]s /
//! [`BufferViewMut`]s of one [`Element`] type and the [`Stream`] that orders it, whatever the
//! backend, so FSDP and context parallelism are written once. Behind it:
//!
//! - in-process CPU ranks (always built): ranks are threads of one process; collectives read
//!   peers' host buffers directly under a round-based rendezvous and are complete when the call
//!   returns. Made by [`CpuWorld::new`]; [`CpuWorld::meta`] makes in-process ranks of the meta
//!   device, whose rounds check every call and move nothing.
//! - HCCL (feature `npu`): one process per NPU, bootstrapped through [`rendezvous`]
//!   (RANK/WORLD_SIZE/LOCAL_RANK and MASTER_ADDR/MASTER_PORT like torchrun, or a shared
//!   directory), made by `Communicator::hccl_from_env` or
//!   `Communicator::hccl_init`. Calls are enqueued on the stream and return before the data
//!   moved; order them with the stream like any other device work (`barrier` alone
//!   synchronises its stream). HCCL has no `ReduceOp::Avg` (an error there, not a silent sum)
//!   and cannot check that ranks agree on a call.
//!
//! - a world of one on any device ([`Communicator::solo`]): every collective is a copy or
//!   nothing, so one process runs the same sharded code as N.
//!
//! Groups split with [`Communicator::split`] (data-parallel x context-parallel). Every buffer
//! and the stream must live on the communicator's device ([`CommError::DeviceMismatch`]). On
//! the CPU every wait for peers is bounded by a timeout; a failure (timeout, a dropped peer,
//! ranks that disagree on the call, a bad argument on one rank) is a [`CommError`] on every rank
//! involved and poisons the group.
//!
//! ```
//! use std::time::Duration;
//! use cannon_runtime::comm::{CpuWorld, ReduceOp};
//! use cannon_runtime::{DeviceBuffer, Stream};
//!
//! let comms = CpuWorld::new(4, Duration::from_secs(10)).unwrap();
//! let handles: Vec<_> = comms
//!     .into_iter()
//!     .map(|c| {
//!         std::thread::spawn(move || {
//!             let stream = Stream::cpu();
//!             let mut x = DeviceBuffer::clone_htod(&stream, &[c.rank() as f32; 3]).unwrap();
//!             c.all_reduce_in_place(&mut x.view_mut(), ReduceOp::Sum, &stream).unwrap();
//!             x.clone_dtoh(&stream).unwrap()
//!         })
//!     })
//!     .collect();
//! for h in handles {
//!     assert_eq!(h.join().unwrap(), vec![6.0; 3]);
//! }
//! ```

mod cpu;
// pub(crate): crate::error names CommError through here, not through this file, which sits
// above buffers and streams.
pub(crate) mod error;
#[cfg(feature = "npu")]
mod hccl;
pub mod rendezvous;
mod solo;
mod store;
mod types;

use std::time::Duration;

pub use cpu::even_counts;
pub use error::{CommError, CommResult};
pub use types::ReduceOp;

use crate::buffer::{BufferView, BufferViewMut};
use crate::device::Device;
use crate::dtype::Element;
use crate::stream::Stream;

/// One rank's handle on a group: in-process CPU ranks or HCCL.
///
/// `Send` (move it into the rank's thread or process) but not `Sync` or `Clone`: a rank issues
/// its calls in order from one place. Dropping a CPU rank tells its peers that it is gone, so
/// their pending and future collectives fail at once instead of waiting for the timeout;
/// dropping an HCCL rank destroys its communicator ([`Communicator::destroy`] reports errors).
#[derive(Debug)]
pub struct Communicator {
    inner: Inner,
    /// Calls issued on this handle (collectives, point-to-point calls, splits), failed ones
    /// included: a test can check that a stretch of work issued none (context parallelism's
    /// vision tower).
    calls: std::cell::Cell<u64>,
}

/// The backend, as an enum for the reason `Stream` has one (see `crate::stream`): the set is
/// closed and known at compile time, and every call is a checked `match`.
#[derive(Debug)]
enum Inner {
    Cpu(cpu::CpuCommunicator),
    Solo(solo::SoloCommunicator),
    #[cfg(feature = "npu")]
    Hccl(hccl::HcclCommunicator),
}

impl From<solo::SoloCommunicator> for Communicator {
    fn from(c: solo::SoloCommunicator) -> Self {
        Communicator {
            inner: Inner::Solo(c),
            calls: std::cell::Cell::new(0),
        }
    }
}

impl From<cpu::CpuCommunicator> for Communicator {
    fn from(c: cpu::CpuCommunicator) -> Self {
        Communicator {
            inner: Inner::Cpu(c),
            calls: std::cell::Cell::new(0),
        }
    }
}

#[cfg(feature = "npu")]
impl From<hccl::HcclCommunicator> for Communicator {
    fn from(c: hccl::HcclCommunicator) -> Self {
        Communicator {
            inner: Inner::Hccl(c),
            calls: std::cell::Cell::new(0),
        }
    }
}

// Here, not in cpu/: a world is its `Communicator`s, and cpu/ sits below this file.
/// Creates the communicators of an in-process world.
pub struct CpuWorld;

impl CpuWorld {
    /// One communicator per rank (index = rank), each to be moved into its own thread.
    /// `timeout` bounds every wait for peers; change it per communicator with
    /// [`Communicator::set_timeout`](Communicator::set_timeout) or per call with
    /// [`Communicator::with_timeout`](Communicator::with_timeout).
    // `CpuWorld` is only a namespace: what a world is, to the caller, is its communicators.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(world_size: usize, timeout: Duration) -> CommResult<Vec<Communicator>> {
        Self::on(Device::Cpu, world_size, timeout)
    }

    /// One communicator per meta rank (see the module docs): the rounds of [`Self::new`]
    /// over buffers of the meta device, which check every call and move nothing.
    pub fn meta(world_size: usize, timeout: Duration) -> CommResult<Vec<Communicator>> {
        Self::on(Device::Meta, world_size, timeout)
    }

    fn on(device: Device, world_size: usize, timeout: Duration) -> CommResult<Vec<Communicator>> {
        let ranks = cpu::world(device, world_size, timeout)?;
        Ok(ranks.into_iter().map(Communicator::from).collect())
    }
}

/// Runs the same call on whichever backend `$self` holds, counting it in `calls`.
macro_rules! counted {
    ($self:expr, $name:literal, $stream:expr, $c:ident => $call:expr) => {{
        $self.calls.set($self.calls.get() + 1);
        let _span = crate::trace::span_on($stream, $name, crate::trace::Cat::Collective);
        dispatch!($self, $c => $call)
    }};
}

/// Runs the same call on whichever backend `$self` holds.
macro_rules! dispatch {
    ($self:expr, $c:ident => $call:expr) => {
        match &$self.inner {
            Inner::Cpu($c) => $call,
            Inner::Solo($c) => $call,
            #[cfg(feature = "npu")]
            Inner::Hccl($c) => $call,
        }
    };
}

impl Communicator {
    /// The one rank of a world of one on `device` (any device): every collective is the
    /// identity, a copy from its send buffer to its receive buffer on the stream. One process
    /// training alone runs the sharded step on it. `timeout` is kept for the calls that
    /// read it (nothing waits).
    pub fn solo(device: Device, timeout: Duration) -> Communicator {
        solo::SoloCommunicator::new(device, timeout).into()
    }

    /// torchrun-style HCCL start: RANK/WORLD_SIZE/LOCAL_RANK and the rendezvous
    /// ([`rendezvous::Rendezvous::from_env`]: CANNON_RDZV_DIR, else the TCP store at
    /// MASTER_ADDR:MASTER_PORT) from the environment, this process on NPU `LOCAL_RANK`.
    /// `timeout` bounds the wait for rank 0's root info (here and in later splits).
    #[cfg(feature = "npu")]
    pub fn hccl_from_env(timeout: Duration) -> CommResult<Communicator> {
        hccl::HcclCommunicator::from_env(timeout).map(Communicator::from)
    }

    /// HCCL rank `rank` of `world_size` on NPU `ordinal`: rank 0 publishes HCCL's root info
    /// through `rdzv`, the others wait for it (at most `timeout`), then all join.
    #[cfg(feature = "npu")]
    pub fn hccl_init(
        rank: usize,
        world_size: usize,
        ordinal: u32,
        rdzv: impl Into<rendezvous::Rendezvous>,
        timeout: Duration,
    ) -> CommResult<Communicator> {
        hccl::HcclCommunicator::init(rank, world_size, ordinal, rdzv.into(), timeout)
            .map(Communicator::from)
    }

    /// Calls issued on this handle so far: every collective, `send`, `recv`, `send_recv`,
    /// `barrier` and `split` counts one, whether it succeeded or not.
    pub fn calls(&self) -> u64 {
        self.calls.get()
    }

    pub fn rank(&self) -> usize {
        dispatch!(self, c => c.rank())
    }

    pub fn world_size(&self) -> usize {
        dispatch!(self, c => c.world_size())
    }

    /// Where this rank's buffers and stream must live.
    pub fn device(&self) -> Device {
        match &self.inner {
            Inner::Cpu(c) => c.device(),
            Inner::Solo(c) => c.device(),
            #[cfg(feature = "npu")]
            Inner::Hccl(c) => c.device(),
        }
    }

    /// The bound on waits for peers: every CPU collective; the rendezvous of HCCL splits
    /// (HCCL's collectives are bounded by `HCCL_EXEC_TIMEOUT`).
    pub fn timeout(&self) -> Duration {
        dispatch!(self, c => c.timeout())
    }

    pub fn set_timeout(&self, timeout: Duration) {
        dispatch!(self, c => c.set_timeout(timeout))
    }

    /// Runs `f` with a different timeout for the calls it makes on this communicator.
    pub fn with_timeout<R>(&self, timeout: Duration, f: impl FnOnce(&Self) -> R) -> R {
        let old = self.timeout();
        self.set_timeout(timeout);
        let out = f(self);
        self.set_timeout(old);
        out
    }

    /// `recv[i] = op over ranks of send[i]`. send, recv: (n,) on every rank.
    pub fn all_reduce<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        op: ReduceOp,
        stream: &Stream,
    ) -> CommResult<()> {
        counted!(self, "all_reduce", stream, c => c.all_reduce(send, recv, op, stream))
    }

    /// `buf[i] = op over ranks of buf[i]`. buf: (n,).
    pub fn all_reduce_in_place<T: Element>(
        &self,
        buf: &mut BufferViewMut<'_, T>,
        op: ReduceOp,
        stream: &Stream,
    ) -> CommResult<()> {
        counted!(self, "all_reduce_in_place", stream, c => c.all_reduce_in_place(buf, op, stream))
    }

    /// Rank-major concatenation. send: (n,), recv: (world * n,), `recv[r*n..(r+1)*n]` = rank r's.
    pub fn all_gather<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        stream: &Stream,
    ) -> CommResult<()> {
        counted!(self, "all_gather", stream, c => c.all_gather(send, recv, stream))
    }

    /// Uneven all_gather (FSDP flat shards). counts: (world,) identical on all ranks;
    /// send: (`counts[rank]`,), recv: (sum counts,), packed in rank order.
    pub fn all_gather_v<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        counts: &[usize],
        stream: &Stream,
    ) -> CommResult<()> {
        counted!(self, "all_gather_v", stream, c => c.all_gather_v(send, recv, counts, stream))
    }

    /// send: (world * m,), recv: (m,) = op over ranks of their `send[rank*m..(rank+1)*m]`.
    /// A send length that does not split evenly is [`CommError::NotDivisible`] (use the _v
    /// form).
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        op: ReduceOp,
        stream: &Stream,
    ) -> CommResult<()> {
        counted!(self, "reduce_scatter", stream, c => c.reduce_scatter(send, recv, op, stream))
    }

    /// Uneven reduce_scatter (FSDP gradient shards). counts: (world,) identical on all ranks;
    /// send: (sum counts,) packed in rank order, recv: (`counts[rank]`,).
    pub fn reduce_scatter_v<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        counts: &[usize],
        op: ReduceOp,
        stream: &Stream,
    ) -> CommResult<()> {
        counted!(self, "reduce_scatter_v", stream, c => c.reduce_scatter_v(send, recv, counts, op, stream))
    }

    /// Copies `root`'s buf into every other rank's buf. buf: (n,) on every rank.
    pub fn broadcast<T: Element>(
        &self,
        buf: &mut BufferViewMut<'_, T>,
        root: usize,
        stream: &Stream,
    ) -> CommResult<()> {
        counted!(self, "broadcast", stream, c => c.broadcast(buf, root, stream))
    }

    /// Equal-chunk all-to-all. send, recv: (world * c,); rank r's recv chunk j is rank j's send
    /// chunk r.
    pub fn all_to_all<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        stream: &Stream,
    ) -> CommResult<()> {
        counted!(self, "all_to_all", stream, c => c.all_to_all(send, recv, stream))
    }

    /// All-to-all with per-peer counts, chunks packed in rank order (displacements are the
    /// prefix sums of the counts). `send_counts[j]`: elements for rank j, `recv_counts[j]`: from
    /// rank j; rank i's `send_counts[j]` must equal rank j's `recv_counts[i]`.
    pub fn all_to_all_v<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        send_counts: &[usize],
        recv: &mut BufferViewMut<'_, T>,
        recv_counts: &[usize],
        stream: &Stream,
    ) -> CommResult<()> {
        counted!(self, "all_to_all_v", stream, c => c.all_to_all_v(send, send_counts, recv, recv_counts, stream))
    }

    /// Returns once every rank of the group called `barrier` (on HCCL: and `stream` drained).
    pub fn barrier(&self, stream: &Stream) -> CommResult<()> {
        counted!(self, "barrier", stream, c => c.barrier(stream))
    }

    /// Sends `buf` to `dst`, matched in order by `recv` on `dst`. On the CPU sends are eager
    /// (copied at once), so a ring of sends then receives cannot deadlock.
    pub fn send<T: Element>(
        &self,
        buf: &BufferView<'_, T>,
        dst: usize,
        stream: &Stream,
    ) -> CommResult<()> {
        counted!(self, "send", stream, c => c.send(buf, dst, stream))
    }

    /// Receives the oldest unreceived message from `src`, which must have `buf.len()` elements
    /// of type `T` (the CPU checks: anything else is [`CommError::Mismatch`]).
    pub fn recv<T: Element>(
        &self,
        buf: &mut BufferViewMut<'_, T>,
        src: usize,
        stream: &Stream,
    ) -> CommResult<()> {
        counted!(self, "recv", stream, c => c.recv(buf, src, stream))
    }

    /// Sends `send` to `dst` and receives `recv` from `src`: the ring step of ring attention,
    /// deadlock-free on both backends.
    pub fn send_recv<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        dst: usize,
        recv: &mut BufferViewMut<'_, T>,
        src: usize,
        stream: &Stream,
    ) -> CommResult<()> {
        counted!(self, "send_recv", stream, c => c.send_recv(send, dst, recv, src, stream))
    }

    /// Splits the group like `MPI_Comm_split`: ranks with the same `color` form a new group,
    /// ordered by `(key, old rank)`. Collective over this group; the new communicator has the
    /// same backend and inherits this one's timeout.
    pub fn split(&self, color: u32, key: u32, stream: &Stream) -> CommResult<Communicator> {
        counted!(self, "split", stream, c => c.split(color, key, stream).map(Communicator::from))
    }

    /// HCCL's asynchronous error state (a failed collective surfaces there, not at enqueue);
    /// always `Ok` on the CPU, whose calls report their errors directly.
    pub fn check_async_error(&self) -> CommResult<()> {
        match &self.inner {
            Inner::Cpu(_) | Inner::Solo(_) => Ok(()),
            #[cfg(feature = "npu")]
            Inner::Hccl(c) => c.check_async_error(),
        }
    }

    /// Leaves the group, reporting the backend's status (dropping ignores it).
    pub fn destroy(self) -> CommResult<()> {
        match self.inner {
            Inner::Cpu(c) => {
                drop(c);
                Ok(())
            }
            Inner::Solo(_) => Ok(()),
            #[cfg(feature = "npu")]
            Inner::Hccl(c) => c.destroy(),
        }
    }
}
