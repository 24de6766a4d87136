//! An emulated communicator and the bodies of its collectives, which run on a stream's worker
//! thread (queued by the exported functions in `super`).
//!
//! Algorithms are the plainest correct ones, since the emulator checks semantics, not speed:
//! every rank sends each peer what that peer needs in one frame, then combines what it got in
//! rank order. Device memory is read and written only through [`crate::mem::resolve`], inside
//! the job, so memory freed between the call and the job's run is caught. Frames are sent
//! straight from device memory and peers' frames written (or reduced) straight into it, so a
//! collective holds only the peers' frames on the host, not copies of its buffers (a
//! reduce-scatter over 4 ranks held 2.75 times its send buffer in host copies; now the three
//! peers' frames, 0.75 times).
//!
//! Once a collective fails on a rank (a dead or hung peer, ranks that disagree on the call),
//! the communicator is poisoned: later calls fail at once with the same reason, and
//! `HcclGetCommAsyncError` reports it, as HCCL's do after an error.

use super::dev_bytes::{dev_bytes, piece_len, pieces, read_dev, reduce_into, write_dev, PIECE};
use super::dtype::DType;
use super::transport::{Kind, Mesh, Meta, PeerError, Timeouts};
use super::work::{Op, Work};
use crate::error::{EmuError, EmuResult};
use cannon_sys::acl::{
    ACL_ERROR_RT_COMM_OP_RETRY_FAIL, ACL_ERROR_RT_SOCKET_CLOSE, ACL_ERROR_RT_TASK_TIMEOUT,
};
use cannon_sys::hccl::{HcclResult, HCCL_E_PARA, HCCL_E_TIMEOUT, HCCL_SUCCESS};
use parking_lot::Mutex;
use std::time::Instant;

/// One rank's communicator.
pub struct Comm {
    pub rank: u32,
    pub n_ranks: u32,
    /// The device that was current when the rank joined; buffers and streams must be on it.
    pub device: u32,
    pub timeouts: Timeouts,
    mesh: Mesh,
    /// Sequence number of the next collective (assigned when the call is queued, so all ranks
    /// number their calls alike).
    next_coll: Mutex<u64>,
    /// Per peer: the next point-to-point message number we send to it / receive from it.
    next_send: Mutex<Vec<u64>>,
    next_recv: Mutex<Vec<u64>>,
    /// The first failure (HCCL code, message), for HcclGetCommAsyncError and poisoning.
    failure: Mutex<Option<(HcclResult, String)>>,
}

/// A collective failure inside a job.
enum Fail {
    Peer(PeerError),
    Mismatch(String),
    Mem(EmuError),
}

impl From<PeerError> for Fail {
    fn from(e: PeerError) -> Self {
        Fail::Peer(e)
    }
}

impl From<EmuError> for Fail {
    fn from(e: EmuError) -> Self {
        Fail::Mem(e)
    }
}

impl Comm {
    pub fn new(mesh: Mesh, device: u32, timeouts: Timeouts) -> Self {
        let n = mesh.n_ranks as usize;
        Self {
            rank: mesh.rank,
            n_ranks: mesh.n_ranks,
            device,
            timeouts,
            mesh,
            next_coll: Mutex::new(0),
            next_send: Mutex::new(vec![0; n]),
            next_recv: Mutex::new(vec![0; n]),
            failure: Mutex::new(None),
        }
    }

    /// HcclGetCommAsyncError's answer.
    pub fn async_error(&self) -> HcclResult {
        self.failure.lock().as_ref().map_or(HCCL_SUCCESS, |f| f.0)
    }

    /// Numbers a call as it is queued: its kind and sequence number.
    pub fn number(&self, work: &Work) -> (Kind, u64) {
        let next = |v: &Mutex<Vec<u64>>, peer: u32| {
            let mut v = v.lock();
            let s = v[peer as usize];
            v[peer as usize] += 1;
            s
        };
        match work {
            Work::Send { peer, .. } => (Kind::P2p, next(&self.next_send, *peer)),
            Work::Recv { peer, .. } => (Kind::P2p, next(&self.next_recv, *peer)),
            _ => {
                let mut c = self.next_coll.lock();
                *c += 1;
                (Kind::Coll, *c)
            }
        }
    }

    /// Runs one queued call (on the stream's worker). `name` is the exported function.
    pub fn run(&self, name: &'static str, seq: u64, meta: Meta, work: Work) -> EmuResult<()> {
        if let Some((_, why)) = self.failure.lock().clone() {
            return Err(EmuError::new(
                ACL_ERROR_RT_COMM_OP_RETRY_FAIL,
                format!("{name}: the communicator failed earlier: {why}"),
            ));
        }
        let started = Instant::now();
        let deadline = started + self.timeouts.exec;
        let r = self.exec(seq, meta, work, deadline, started);
        let Err(fail) = r else { return Ok(()) };
        let where_ = format!(
            "{name} (rank {} of {}, call #{seq})",
            self.rank, self.n_ranks
        );
        let (hccl, acl, msg) = match fail {
            Fail::Peer(e) => {
                let acl = if e.hccl_code() == HCCL_E_TIMEOUT {
                    ACL_ERROR_RT_TASK_TIMEOUT
                } else {
                    ACL_ERROR_RT_SOCKET_CLOSE
                };
                (e.hccl_code(), acl, format!("{where_}: {e}"))
            }
            Fail::Mismatch(m) => (
                HCCL_E_PARA,
                ACL_ERROR_RT_COMM_OP_RETRY_FAIL,
                format!("{where_}: ranks disagree: {m}"),
            ),
            Fail::Mem(e) => (HCCL_E_PARA, e.code, format!("{where_}: {}", e.message)),
        };
        self.failure.lock().get_or_insert((hccl, msg.clone()));
        Err(EmuError::new(acl, msg))
    }

    /// Receives piece `at.1` of `(kind, at.0)` from `peer` and checks that the peer made the
    /// same call.
    fn take(
        &self,
        peer: u32,
        kind: Kind,
        at: (u64, u64),
        want: Meta,
        deadline: Instant,
        started: Instant,
    ) -> Result<Vec<u8>, Fail> {
        let f = self.mesh.recv(peer, kind, at, deadline, started)?;
        if f.meta != want {
            return Err(Fail::Mismatch(format!(
                "rank {peer} made {} (dataType {}, count {}, op {}, root {}), this rank {} \
                 (dataType {}, count {}, op {}, root {})",
                Op::name(f.meta.op),
                f.meta.dtype,
                f.meta.count,
                f.meta.reduce,
                f.meta.root,
                Op::name(want.op),
                want.dtype,
                want.count,
                want.reduce,
                want.root
            )));
        }
        Ok(f.payload)
    }

    fn peers(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.n_ranks).filter(move |&r| r != self.rank)
    }

    fn exec(
        &self,
        seq: u64,
        meta: Meta,
        work: Work,
        deadline: Instant,
        started: Instant,
    ) -> Result<(), Fail> {
        let c = Kind::Coll;
        let me = self.rank as usize;
        let n = self.n_ranks as usize;
        let dtype = DType(meta.dtype);
        match work {
            Work::AllReduce { send, recv, bytes } => {
                // In place (the same buffer) each piece is read before it is written.
                let piece = match send == recv {
                    true => PIECE,
                    false => piece_len(send, bytes, recv, bytes),
                };
                for (k, r) in pieces(bytes, piece) {
                    let at = (seq, k);
                    // SAFETY: only read; the receive range is written by `reduce_into`, which
                    // goes through a host buffer when it overlaps the send range.
                    let mine = unsafe { dev_bytes(send + r.start, r.len()) }?;
                    for p in self.peers() {
                        self.mesh.send(p, c, at, meta, mine)?;
                    }
                    let got = self.take_peers(at, meta, r.len(), deadline, started)?;
                    let parts = self.in_rank_order(&got, mine);
                    reduce_into(
                        dtype,
                        meta.reduce,
                        &parts,
                        (send, bytes),
                        recv + r.start,
                        r.len(),
                    )?;
                }
            }
            Work::Reduce {
                send,
                recv,
                bytes,
                root,
            } => {
                let piece = match send == recv {
                    true => PIECE,
                    false => piece_len(send, bytes, recv, bytes),
                };
                for (k, r) in pieces(bytes, piece) {
                    let at = (seq, k);
                    // SAFETY: as in AllReduce.
                    let mine = unsafe { dev_bytes(send + r.start, r.len()) }?;
                    if self.rank != root {
                        self.mesh.send(root, c, at, meta, mine)?;
                    } else {
                        let got = self.take_peers(at, meta, r.len(), deadline, started)?;
                        let parts = self.in_rank_order(&got, mine);
                        let out = recv + r.start;
                        reduce_into(dtype, meta.reduce, &parts, (send, bytes), out, r.len())?;
                    }
                }
            }
            Work::Broadcast { buf, bytes, root } => {
                for (k, r) in pieces(bytes, PIECE) {
                    let at = (seq, k);
                    if self.rank == root {
                        // SAFETY: only read, and nothing writes the buffer on the root.
                        let data = unsafe { dev_bytes(buf + r.start, r.len()) }?;
                        for p in self.peers() {
                            self.mesh.send(p, c, at, meta, data)?;
                        }
                    } else {
                        let data = self.take(root, c, at, meta, deadline, started)?;
                        self.check_len(root, data.len(), r.len())?;
                        write_dev(buf + r.start, &data)?;
                    }
                }
            }
            Work::ReduceScatter { send, recv, chunk } => {
                // Only this rank's own chunk may be the receive buffer (in place).
                let own = send + me * chunk;
                let piece = if recv == own {
                    PIECE
                } else {
                    piece_len(send, chunk * n, recv, chunk)
                };
                for (k, r) in pieces(chunk, piece) {
                    let at = (seq, k);
                    for p in self.peers() {
                        let from = send + p as usize * chunk + r.start;
                        // SAFETY: only read; peers' chunks are never the receive buffer here.
                        let part = unsafe { dev_bytes(from, r.len()) }?;
                        self.mesh.send(p, c, at, meta, part)?;
                    }
                    let got = self.take_peers(at, meta, r.len(), deadline, started)?;
                    // SAFETY: only read before `reduce_into` writes (through a host buffer
                    // when the receive range overlaps the send buffer).
                    let mine = unsafe { dev_bytes(own + r.start, r.len()) }?;
                    let parts = self.in_rank_order(&got, mine);
                    let out = recv + r.start;
                    reduce_into(dtype, meta.reduce, &parts, (send, chunk * n), out, r.len())?;
                }
            }
            Work::AllGather { send, recv, chunk } => {
                // In place, the send buffer is this rank's chunk of the receive buffer.
                let own = recv + me * chunk;
                let piece = if send == own {
                    PIECE
                } else {
                    piece_len(send, chunk, recv, chunk * n)
                };
                for (k, r) in pieces(chunk, piece) {
                    let at = (seq, k);
                    let mine = read_dev(send + r.start, r.len())?;
                    for p in self.peers() {
                        self.mesh.send(p, c, at, meta, &mine)?;
                    }
                    if own != send {
                        write_dev(own + r.start, &mine)?;
                    }
                    // Each peer's piece straight into place, its frame dropped as written.
                    for p in self.peers() {
                        let d = self.take(p, c, at, meta, deadline, started)?;
                        self.check_len(p, d.len(), r.len())?;
                        write_dev(recv + p as usize * chunk + r.start, &d)?;
                    }
                }
            }
            Work::AlltoAll { send, recv, chunk } => {
                // In place (the same buffer) each piece is read before it is written; any
                // other overlap goes in one piece.
                let piece = if send == recv {
                    PIECE
                } else {
                    piece_len(send, chunk * n, recv, chunk * n)
                };
                for (k, r) in pieces(chunk, piece) {
                    let at = (seq, k);
                    for p in self.peers() {
                        let from = send + p as usize * chunk + r.start;
                        // SAFETY: only read, before anything of this piece is written.
                        let part = unsafe { dev_bytes(from, r.len()) }?;
                        self.mesh.send(p, c, at, meta, part)?;
                    }
                    let mine = read_dev(send + me * chunk + r.start, r.len())?;
                    // Every peer's piece read before any is written.
                    let mut incoming = Vec::with_capacity(n);
                    for p in self.peers() {
                        let d = self.take(p, c, at, meta, deadline, started)?;
                        self.check_len(p, d.len(), r.len())?;
                        incoming.push((p as usize, d));
                    }
                    write_dev(recv + me * chunk + r.start, &mine)?;
                    for (p, d) in incoming {
                        write_dev(recv + p * chunk + r.start, &d)?;
                    }
                }
            }
            Work::AlltoAllV {
                send,
                send_parts,
                recv,
                recv_parts,
                elem,
            } => {
                // One piece per peer (its parts are a sequence's share, not a model's group).
                let at = (seq, 0);
                // Each frame carries its element count in `meta.count`; the receiver expects
                // its own recvCounts[peer] there.
                for p in self.peers() {
                    let (off, len) = send_parts[p as usize];
                    let m = Meta {
                        count: (len / elem) as u64,
                        ..meta
                    };
                    // SAFETY: only read, before anything is written.
                    let part = unsafe { dev_bytes(send + off, len) }?;
                    self.mesh.send(p, c, at, m, part)?;
                }
                let (so, sl) = send_parts[me];
                let (ro, rl) = recv_parts[me];
                if sl != rl {
                    return Err(Fail::Mismatch(format!(
                        "this rank sends itself {} elements but expects {}",
                        sl / elem,
                        rl / elem
                    )));
                }
                let own = read_dev(send + so, sl)?;
                let mut incoming = Vec::with_capacity(n);
                for p in self.peers() {
                    let (off, len) = recv_parts[p as usize];
                    let m = Meta {
                        count: (len / elem) as u64,
                        ..meta
                    };
                    incoming.push((off, self.take(p, c, at, m, deadline, started)?));
                }
                write_dev(recv + ro, &own)?;
                for (off, d) in incoming {
                    write_dev(recv + off, &d)?;
                }
            }
            Work::Barrier => {
                for p in self.peers() {
                    self.mesh.send(p, c, (seq, 0), meta, &[])?;
                }
                self.take_peers((seq, 0), meta, 0, deadline, started)?;
            }
            Work::Send { buf, bytes, peer } => {
                // HCCL's send completes when the receiver takes the data: wait for its
                // "ready" first, so a program whose sends and receives cannot pair up hangs
                // (until HCCL_EXEC_TIMEOUT) here as it would on hardware.
                let cts = Meta { op: 0, ..meta };
                self.take(peer, Kind::Cts, (seq, 0), cts, deadline, started)?;
                for (k, r) in pieces(bytes, PIECE) {
                    // SAFETY: only read; a send writes nothing.
                    let data = unsafe { dev_bytes(buf + r.start, r.len()) }?;
                    self.mesh.send(peer, Kind::P2p, (seq, k), meta, data)?;
                }
            }
            Work::Recv { buf, bytes, peer } => {
                let cts = Meta { op: 0, ..meta };
                self.mesh.send(peer, Kind::Cts, (seq, 0), cts, &[])?;
                let want = Meta {
                    op: Op::Send as u32,
                    ..meta
                };
                for (k, r) in pieces(bytes, PIECE) {
                    let data = self.take(peer, Kind::P2p, (seq, k), want, deadline, started)?;
                    self.check_len(peer, data.len(), r.len())?;
                    write_dev(buf + r.start, &data)?;
                }
            }
        }
        Ok(())
    }

    /// Every peer's frame of piece `at`, in rank order without ours, each checked to hold
    /// `len` bytes.
    fn take_peers(
        &self,
        at: (u64, u64),
        meta: Meta,
        len: usize,
        deadline: Instant,
        started: Instant,
    ) -> Result<Vec<Vec<u8>>, Fail> {
        let mut out = Vec::with_capacity(self.n_ranks as usize);
        for r in self.peers() {
            let d = self.take(r, Kind::Coll, at, meta, deadline, started)?;
            self.check_len(r, d.len(), len)?;
            out.push(d);
        }
        Ok(out)
    }

    /// The peers' frames with `mine` at this rank's place: the order every rank reduces in.
    fn in_rank_order<'a>(&self, peers: &'a [Vec<u8>], mine: &'a [u8]) -> Vec<&'a [u8]> {
        let mut parts: Vec<&[u8]> = peers.iter().map(Vec::as_slice).collect();
        parts.insert(self.rank as usize, mine);
        parts
    }

    fn check_len(&self, peer: u32, got: usize, want: usize) -> Result<(), Fail> {
        if got == want {
            return Ok(());
        }
        Err(Fail::Mismatch(format!(
            "rank {peer} sent {got} bytes, this rank expects {want}"
        )))
    }
}
