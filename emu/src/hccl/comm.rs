//! An emulated communicator and the bodies of its collectives, which run on a stream's worker
//! thread (queued by the exported functions in `super`).
//!
//! Algorithms are the plainest correct ones, since the emulator checks semantics, not speed:
//! every rank sends each peer what that peer needs in one frame, then combines what it got in
//! rank order. Device memory is read and written only through [`crate::mem::resolve`], inside
//! the job, so memory freed between the call and the job's run is caught.
//!
//! Once a collective fails on a rank (a dead or hung peer, ranks that disagree on the call),
//! the communicator is poisoned: later calls fail at once with the same reason, and
//! `HcclGetCommAsyncError` reports it, as HCCL's do after an error.

use super::dtype::{reduce, DType};
use super::transport::{Frame, Kind, Mesh, Meta, PeerError, Timeouts};
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

/// Operation codes carried in frames (so a receiver can name what its peer called).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Op {
    AllReduce = 1,
    Broadcast,
    ReduceScatter,
    AllGather,
    AlltoAll,
    AlltoAllV,
    Reduce,
    Barrier,
    Send,
}

impl Op {
    pub fn name(code: u32) -> &'static str {
        match code {
            1 => "HcclAllReduce",
            2 => "HcclBroadcast",
            3 => "HcclReduceScatter",
            4 => "HcclAllGather",
            5 => "HcclAlltoAll",
            6 => "HcclAlltoAllV",
            7 => "HcclReduce",
            8 => "HcclBarrier",
            9 => "HcclSend",
            _ => "an unknown call",
        }
    }
}

/// What a queued collective does, with its buffers as device addresses.
#[derive(Debug, Clone)]
pub enum Work {
    AllReduce {
        send: usize,
        recv: usize,
        bytes: usize,
    },
    Reduce {
        send: usize,
        recv: usize,
        bytes: usize,
        root: u32,
    },
    Broadcast {
        buf: usize,
        bytes: usize,
        root: u32,
    },
    ReduceScatter {
        send: usize,
        recv: usize,
        chunk: usize,
    },
    AllGather {
        send: usize,
        recv: usize,
        chunk: usize,
    },
    AlltoAll {
        send: usize,
        recv: usize,
        chunk: usize,
    },
    /// Byte offsets and lengths per peer.
    AlltoAllV {
        send: usize,
        send_parts: Vec<(usize, usize)>,
        recv: usize,
        recv_parts: Vec<(usize, usize)>,
        elem: usize,
    },
    Barrier,
    Send {
        buf: usize,
        bytes: usize,
        peer: u32,
    },
    Recv {
        buf: usize,
        bytes: usize,
        peer: u32,
    },
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

fn read_dev(addr: usize, len: usize) -> EmuResult<Vec<u8>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let p = crate::mem::resolve(addr, len)?;
    // SAFETY: `resolve` checked [addr, addr+len) lies in one live allocation; `p` is its host
    // backing.
    Ok(unsafe { std::slice::from_raw_parts(p, len) }.to_vec())
}

fn write_dev(addr: usize, data: &[u8]) -> EmuResult<()> {
    if data.is_empty() {
        return Ok(());
    }
    let p = crate::mem::resolve(addr, data.len())?;
    // SAFETY: as in `read_dev`; `data` is host memory of our own, never the backing itself.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
    Ok(())
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

    fn frame(&self, kind: Kind, seq: u64, meta: Meta, payload: Vec<u8>) -> Frame {
        Frame {
            kind,
            seq,
            meta,
            payload,
        }
    }

    /// Receives `(kind, seq)` from `peer` and checks that the peer made the same call.
    fn take(
        &self,
        peer: u32,
        kind: Kind,
        seq: u64,
        want: Meta,
        deadline: Instant,
        started: Instant,
    ) -> Result<Vec<u8>, Fail> {
        let f = self.mesh.recv(peer, kind, seq, deadline, started)?;
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
                let mine = read_dev(send, bytes)?;
                for p in self.peers() {
                    self.mesh.send(p, &self.frame(c, seq, meta, mine.clone()))?;
                }
                let got = self.gather_all(seq, meta, mine, deadline, started)?;
                let parts: Vec<&[u8]> = got.iter().map(|v| v.as_slice()).collect();
                let mut out = vec![0u8; bytes];
                reduce(dtype, meta.reduce, &parts, &mut out)?;
                write_dev(recv, &out)?;
            }
            Work::Reduce {
                send,
                recv,
                bytes,
                root,
            } => {
                let mine = read_dev(send, bytes)?;
                if self.rank != root {
                    self.mesh.send(root, &self.frame(c, seq, meta, mine))?;
                } else {
                    let got = self.gather_all(seq, meta, mine, deadline, started)?;
                    let parts: Vec<&[u8]> = got.iter().map(|v| v.as_slice()).collect();
                    let mut out = vec![0u8; bytes];
                    reduce(dtype, meta.reduce, &parts, &mut out)?;
                    write_dev(recv, &out)?;
                }
            }
            Work::Broadcast { buf, bytes, root } => {
                if self.rank == root {
                    let data = read_dev(buf, bytes)?;
                    for p in self.peers() {
                        self.mesh.send(p, &self.frame(c, seq, meta, data.clone()))?;
                    }
                } else {
                    let data = self.take(root, c, seq, meta, deadline, started)?;
                    self.check_len(root, data.len(), bytes)?;
                    write_dev(buf, &data)?;
                }
            }
            Work::ReduceScatter { send, recv, chunk } => {
                let all = read_dev(send, chunk * n)?;
                for p in self.peers() {
                    let part = all[p as usize * chunk..(p as usize + 1) * chunk].to_vec();
                    self.mesh.send(p, &self.frame(c, seq, meta, part))?;
                }
                let mine = all[me * chunk..(me + 1) * chunk].to_vec();
                let got = self.gather_all(seq, meta, mine, deadline, started)?;
                let parts: Vec<&[u8]> = got.iter().map(|v| v.as_slice()).collect();
                let mut out = vec![0u8; chunk];
                reduce(dtype, meta.reduce, &parts, &mut out)?;
                write_dev(recv, &out)?;
            }
            Work::AllGather { send, recv, chunk } => {
                let mine = read_dev(send, chunk)?;
                for p in self.peers() {
                    self.mesh.send(p, &self.frame(c, seq, meta, mine.clone()))?;
                }
                let got = self.gather_all(seq, meta, mine, deadline, started)?;
                write_dev(recv, &got.concat())?;
            }
            Work::AlltoAll { send, recv, chunk } => {
                let all = read_dev(send, chunk * n)?;
                for p in self.peers() {
                    let part = all[p as usize * chunk..(p as usize + 1) * chunk].to_vec();
                    self.mesh.send(p, &self.frame(c, seq, meta, part))?;
                }
                let mut out = vec![0u8; chunk * n];
                out[me * chunk..(me + 1) * chunk]
                    .copy_from_slice(&all[me * chunk..(me + 1) * chunk]);
                for p in self.peers() {
                    let d = self.take(p, c, seq, meta, deadline, started)?;
                    self.check_len(p, d.len(), chunk)?;
                    out[p as usize * chunk..(p as usize + 1) * chunk].copy_from_slice(&d);
                }
                write_dev(recv, &out)?;
            }
            Work::AlltoAllV {
                send,
                send_parts,
                recv,
                recv_parts,
                elem,
            } => {
                // Each frame carries its element count in `meta.count`; the receiver expects
                // its own recvCounts[peer] there.
                for p in self.peers() {
                    let (off, len) = send_parts[p as usize];
                    let m = Meta {
                        count: (len / elem) as u64,
                        ..meta
                    };
                    self.mesh
                        .send(p, &self.frame(c, seq, m, read_dev(send + off, len)?))?;
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
                    incoming.push((off, self.take(p, c, seq, m, deadline, started)?));
                }
                write_dev(recv + ro, &own)?;
                for (off, d) in incoming {
                    write_dev(recv + off, &d)?;
                }
            }
            Work::Barrier => {
                for p in self.peers() {
                    self.mesh.send(p, &self.frame(c, seq, meta, Vec::new()))?;
                }
                self.gather_all(seq, meta, Vec::new(), deadline, started)?;
            }
            Work::Send { buf, bytes, peer } => {
                // HCCL's send completes when the receiver takes the data: wait for its
                // "ready" first, so a program whose sends and receives cannot pair up hangs
                // (until HCCL_EXEC_TIMEOUT) here as it would on hardware.
                let cts = Meta { op: 0, ..meta };
                self.take(peer, Kind::Cts, seq, cts, deadline, started)?;
                let data = read_dev(buf, bytes)?;
                self.mesh
                    .send(peer, &self.frame(Kind::P2p, seq, meta, data))?;
            }
            Work::Recv { buf, bytes, peer } => {
                let cts = Meta { op: 0, ..meta };
                self.mesh
                    .send(peer, &self.frame(Kind::Cts, seq, cts, Vec::new()))?;
                let want = Meta {
                    op: Op::Send as u32,
                    ..meta
                };
                let data = self.take(peer, Kind::P2p, seq, want, deadline, started)?;
                self.check_len(peer, data.len(), bytes)?;
                write_dev(buf, &data)?;
            }
        }
        Ok(())
    }

    /// Every rank's frame of collective `seq` in rank order (ours is `mine`).
    fn gather_all(
        &self,
        seq: u64,
        meta: Meta,
        mine: Vec<u8>,
        deadline: Instant,
        started: Instant,
    ) -> Result<Vec<Vec<u8>>, Fail> {
        let mut out = Vec::with_capacity(self.n_ranks as usize);
        let mut mine = Some(mine);
        for r in 0..self.n_ranks {
            if r == self.rank {
                out.push(mine.take().unwrap_or_default());
            } else {
                let d = self.take(r, Kind::Coll, seq, meta, deadline, started)?;
                out.push(d);
            }
        }
        let want = out[self.rank as usize].len();
        for (r, d) in out.iter().enumerate() {
            self.check_len(r as u32, d.len(), want)?;
        }
        Ok(out)
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
