//! Test support: run a closure on every rank of a CPU world, deterministic inputs, and an
//! independent sequential reference for the reductions.
//!
//! The tests state their cases on host vectors; [`Rank`] carries each call through the one
//! `Communicator` interface (device buffers and a stream), copying the vectors into CPU
//! buffers and the results back.

use std::fmt::Debug;
use std::time::Duration;

use cannon_runtime::comm::{CommResult, Communicator, CpuWorld, ReduceOp};
use cannon_runtime::rng::SplitMix64;
use cannon_runtime::{DeviceBuffer, Element, Stream};
use half::bf16;

/// One rank: its communicator and the (CPU) stream its calls are issued on.
pub struct Rank {
    pub comm: Communicator,
    pub stream: Stream,
}

impl Rank {
    pub fn new(comm: Communicator) -> Rank {
        Rank {
            comm,
            stream: Stream::cpu(),
        }
    }

    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    pub fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    pub fn timeout(&self) -> Duration {
        self.comm.timeout()
    }

    pub fn with_timeout<R>(&self, timeout: Duration, f: impl FnOnce(&Self) -> R) -> R {
        self.comm.with_timeout(timeout, |_| f(self))
    }

    fn up<T: Element>(&self, v: &[T]) -> DeviceBuffer<T> {
        DeviceBuffer::clone_htod(&self.stream, v).unwrap()
    }

    fn down<T: Element>(&self, b: &DeviceBuffer<T>, out: &mut [T]) {
        b.memcpy_dtoh(&self.stream, out).unwrap()
    }

    /// Runs a send/recv call on buffers holding `send` and `recv`, then copies recv back.
    fn send_recv_bufs<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        call: impl FnOnce(&DeviceBuffer<T>, &mut DeviceBuffer<T>) -> CommResult<()>,
    ) -> CommResult<()> {
        let s = self.up(send);
        let mut r = self.up(recv);
        let out = call(&s, &mut r);
        self.down(&r, recv);
        out
    }

    /// Runs a call on a buffer holding `buf`, then copies it back.
    fn in_place<T: Element>(
        &self,
        buf: &mut [T],
        call: impl FnOnce(&mut DeviceBuffer<T>) -> CommResult<()>,
    ) -> CommResult<()> {
        let mut b = self.up(buf);
        let out = call(&mut b);
        self.down(&b, buf);
        out
    }

    pub fn all_reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> CommResult<()> {
        self.send_recv_bufs(send, recv, |s, r| {
            self.comm
                .all_reduce(&s.view(), &mut r.view_mut(), op, &self.stream)
        })
    }

    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> CommResult<()> {
        self.in_place(buf, |b| {
            self.comm
                .all_reduce_in_place(&mut b.view_mut(), op, &self.stream)
        })
    }

    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> CommResult<()> {
        self.send_recv_bufs(send, recv, |s, r| {
            self.comm
                .all_gather(&s.view(), &mut r.view_mut(), &self.stream)
        })
    }

    pub fn all_gather_v<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
    ) -> CommResult<()> {
        self.send_recv_bufs(send, recv, |s, r| {
            self.comm
                .all_gather_v(&s.view(), &mut r.view_mut(), counts, &self.stream)
        })
    }

    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> CommResult<()> {
        self.send_recv_bufs(send, recv, |s, r| {
            self.comm
                .reduce_scatter(&s.view(), &mut r.view_mut(), op, &self.stream)
        })
    }

    pub fn reduce_scatter_v<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: ReduceOp,
    ) -> CommResult<()> {
        self.send_recv_bufs(send, recv, |s, r| {
            self.comm
                .reduce_scatter_v(&s.view(), &mut r.view_mut(), counts, op, &self.stream)
        })
    }

    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> CommResult<()> {
        self.in_place(buf, |b| {
            self.comm.broadcast(&mut b.view_mut(), root, &self.stream)
        })
    }

    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> CommResult<()> {
        self.send_recv_bufs(send, recv, |s, r| {
            self.comm
                .all_to_all(&s.view(), &mut r.view_mut(), &self.stream)
        })
    }

    pub fn all_to_all_v<T: Element>(
        &self,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> CommResult<()> {
        self.send_recv_bufs(send, recv, |s, r| {
            self.comm.all_to_all_v(
                &s.view(),
                send_counts,
                &mut r.view_mut(),
                recv_counts,
                &self.stream,
            )
        })
    }

    pub fn barrier(&self) -> CommResult<()> {
        self.comm.barrier(&self.stream)
    }

    pub fn send<T: Element>(&self, buf: &[T], dst: usize) -> CommResult<()> {
        self.comm.send(&self.up(buf).view(), dst, &self.stream)
    }

    pub fn recv<T: Element>(&self, buf: &mut [T], src: usize) -> CommResult<()> {
        self.in_place(buf, |b| {
            self.comm.recv(&mut b.view_mut(), src, &self.stream)
        })
    }

    pub fn send_recv<T: Element>(
        &self,
        send: &[T],
        dst: usize,
        recv: &mut [T],
        src: usize,
    ) -> CommResult<()> {
        self.send_recv_bufs(send, recv, |s, r| {
            self.comm
                .send_recv(&s.view(), dst, &mut r.view_mut(), src, &self.stream)
        })
    }

    pub fn split(&self, color: u32, key: u32) -> CommResult<Rank> {
        Ok(Rank::new(self.comm.split(color, key, &self.stream)?))
    }
}

/// Runs `f` on every rank (one thread each) and returns the results in rank order.
pub fn run_world<R: Send>(world: usize, timeout: Duration, f: impl Fn(Rank) -> R + Sync) -> Vec<R> {
    let comms = CpuWorld::new(world, timeout).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| s.spawn(|| f(Rank::new(c))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Long enough never to fire in a passing test, short enough not to hang a failing one.
pub const GENEROUS: Duration = Duration::from_secs(20);

/// One SplitMix64 step from state `x`: a stateless hash for per-element inputs.
fn splitmix(x: u64) -> u64 {
    SplitMix64::new(x).next_u64()
}

/// Element types under test: a deterministic generator and the sequential reference reduction.
pub trait TestElem: Element + PartialEq + Debug {
    const HAS_AVG: bool;
    /// The value of element `i` of rank `rank`'s input `seed`.
    fn gen(seed: u64, rank: usize, i: usize) -> Self;
    /// `op` over `vals` (rank order), computed the obvious way on one thread.
    fn reference(op: ReduceOp, vals: &[Self]) -> Self;
}

fn unit(seed: u64, rank: usize, i: usize) -> f64 {
    let h = splitmix(seed ^ splitmix(rank as u64 ^ splitmix(i as u64)));
    // Values in [-4, 4) with a non-trivial mantissa, so rounding and order matter.
    (h >> 11) as f64 / (1u64 << 53) as f64 * 8.0 - 4.0
}

macro_rules! float_ref {
    ($t:ty) => {
        fn reference(op: ReduceOp, vals: &[$t]) -> $t {
            let mut acc = vals[0];
            for &v in &vals[1..] {
                acc = match op {
                    ReduceOp::Sum | ReduceOp::Avg => acc + v,
                    ReduceOp::Max => {
                        if v > acc {
                            v
                        } else {
                            acc
                        }
                    }
                    ReduceOp::Min => {
                        if v < acc {
                            v
                        } else {
                            acc
                        }
                    }
                };
            }
            if op == ReduceOp::Avg {
                acc / vals.len() as $t
            } else {
                acc
            }
        }
    };
}

impl TestElem for f32 {
    const HAS_AVG: bool = true;
    fn gen(seed: u64, rank: usize, i: usize) -> Self {
        unit(seed, rank, i) as f32
    }
    float_ref!(f32);
}

impl TestElem for f64 {
    const HAS_AVG: bool = true;
    fn gen(seed: u64, rank: usize, i: usize) -> Self {
        unit(seed, rank, i)
    }
    float_ref!(f64);
}

impl TestElem for bf16 {
    const HAS_AVG: bool = true;
    fn gen(seed: u64, rank: usize, i: usize) -> Self {
        bf16::from_f64(unit(seed, rank, i))
    }
    /// The contract: accumulate in f32 in rank order, round to bf16 once.
    fn reference(op: ReduceOp, vals: &[bf16]) -> bf16 {
        let wide: Vec<f32> = vals.iter().map(|v| v.to_f32()).collect();
        bf16::from_f32(f32::reference(op, &wide))
    }
}

macro_rules! int_elem {
    ($t:ty) => {
        impl TestElem for $t {
            const HAS_AVG: bool = false;
            fn gen(seed: u64, rank: usize, i: usize) -> Self {
                (unit(seed, rank, i) * 250.0) as $t
            }
            fn reference(op: ReduceOp, vals: &[$t]) -> $t {
                match op {
                    ReduceOp::Sum => vals.iter().sum(),
                    ReduceOp::Max => *vals.iter().max().unwrap(),
                    ReduceOp::Min => *vals.iter().min().unwrap(),
                    ReduceOp::Avg => unreachable!("integer Avg is rejected"),
                }
            }
        }
    };
}
int_elem!(i32);
int_elem!(i64);

/// Rank `rank`'s input of `n` elements for `seed`.
pub fn input<T: TestElem>(seed: u64, rank: usize, n: usize) -> Vec<T> {
    (0..n).map(|i| T::gen(seed, rank, i)).collect()
}

/// The reduction over all ranks' inputs of element `i` (of a buffer of any length).
pub fn reduced<T: TestElem>(seed: u64, world: usize, op: ReduceOp, i: usize) -> T {
    let vals: Vec<T> = (0..world).map(|r| T::gen(seed, r, i)).collect();
    T::reference(op, &vals)
}

pub fn ops<T: TestElem>() -> Vec<ReduceOp> {
    let mut v = vec![ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min];
    if T::HAS_AVG {
        v.push(ReduceOp::Avg);
    }
    v
}

pub const WORLDS: [usize; 5] = [1, 2, 3, 4, 8];
