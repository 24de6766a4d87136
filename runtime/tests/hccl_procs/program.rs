//! One program of every collective, run by each rank on HCCL and on an in-process CPU world of
//! the same size with the same inputs; the rank compares its results of the two.

use std::time::Duration;

use cannon_runtime::comm::{even_counts, Communicator, CpuWorld, ReduceOp};
use cannon_runtime::{DeviceBuffer, Element, Stream};
use half::bf16;

/// A result of one step.
#[derive(Debug, Clone)]
pub enum Vals {
    I32(Vec<i32>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
}

/// How a step's results compare: exactly, or as a sum (with each element's `sum_r |x_r|`).
#[derive(Debug, Clone)]
pub enum Tol {
    Exact,
    Sum(Vec<f64>),
}

pub struct Step {
    pub name: &'static str,
    pub vals: Vals,
    pub tol: Tol,
}

/// Deterministic inputs in [-1, 1] with magnitudes spread over four decades, per (rank, salt).
fn floats(rank: usize, len: usize, salt: u64) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let mut h = (rank as u64 + 1)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add((i as u64) << 20)
                .wrapping_add(salt.wrapping_mul(0xBF58_476D_1CE4_E5B9));
            h ^= h >> 31;
            h = h.wrapping_mul(0x94D0_49BB_1331_11EB);
            h ^= h >> 29;
            let u = (h >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
            let mag = 10f64.powf(-4.0 * ((h & 0xff) as f64 / 255.0));
            ((2.0 * u - 1.0) * mag) as f32
        })
        .collect()
}

fn ints(rank: usize, len: usize, salt: i32) -> Vec<i32> {
    (0..len as i32)
        .map(|i| (rank as i32 + 1) * 1000 - i * 7 + salt * ((i + rank as i32) % 5))
        .collect()
}

fn bf(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

/// `sum_r |x_r[i]|` over every rank's input.
fn abs_sum(n: usize, f: impl Fn(usize) -> Vec<f64>) -> Vec<f64> {
    let all: Vec<Vec<f64>> = (0..n).map(f).collect();
    (0..all[0].len())
        .map(|i| all.iter().map(|v| v[i].abs()).sum())
        .collect()
}

fn up<T: Element>(s: &Stream, v: &[T]) -> DeviceBuffer<T> {
    DeviceBuffer::clone_htod(s, v).unwrap()
}

fn zeros<T: Element>(s: &Stream, n: usize) -> DeviceBuffer<T> {
    DeviceBuffer::alloc_zeros(s, n).unwrap()
}

fn down<T: Element>(s: &Stream, b: &DeviceBuffer<T>) -> Vec<T> {
    b.clone_dtoh(s).unwrap()
}

/// The program: every collective of `Communicator` once (several dtypes and ops), on whichever
/// backend `comm` is. Results in order.
pub fn program(comm: &Communicator, s: &Stream) -> Vec<Step> {
    let (me, n) = (comm.rank(), comm.world_size());
    let mut out = Vec::new();
    let mut push = |name, vals, tol| out.push(Step { name, vals, tol });
    let as64 = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<_>>();

    // all_reduce: i32 sum, f32 sum/max/min, bf16 sum/max, i64 sum, in place.
    let x = up(s, &ints(me, 37, 1));
    let mut y = zeros::<i32>(s, 37);
    comm.all_reduce(&x.view(), &mut y.view_mut(), ReduceOp::Sum, s)
        .unwrap();
    push("all_reduce i32 sum", Vals::I32(down(s, &y)), Tol::Exact);

    let len = 1000;
    let xf = up(s, &floats(me, len, 2));
    let tol = Tol::Sum(abs_sum(n, |r| as64(floats(r, len, 2))));
    for (op, name) in [
        (ReduceOp::Sum, "all_reduce f32 sum"),
        (ReduceOp::Max, "all_reduce f32 max"),
        (ReduceOp::Min, "all_reduce f32 min"),
    ] {
        let mut yf = zeros::<f32>(s, len);
        comm.all_reduce(&xf.view(), &mut yf.view_mut(), op, s)
            .unwrap();
        let t = if op == ReduceOp::Sum {
            tol.clone()
        } else {
            Tol::Exact
        };
        push(name, Vals::F32(down(s, &yf)), t);
    }

    let xb = up(s, &bf(&floats(me, 257, 3)));
    let btol = Tol::Sum(abs_sum(n, |r| {
        bf(&floats(r, 257, 3)).iter().map(|b| b.to_f64()).collect()
    }));
    for (op, name) in [
        (ReduceOp::Sum, "all_reduce bf16 sum"),
        (ReduceOp::Max, "all_reduce bf16 max"),
    ] {
        let mut yb = zeros::<bf16>(s, 257);
        comm.all_reduce(&xb.view(), &mut yb.view_mut(), op, s)
            .unwrap();
        let t = if op == ReduceOp::Sum {
            btol.clone()
        } else {
            Tol::Exact
        };
        push(name, Vals::Bf16(down(s, &yb)), t);
    }

    let big: Vec<i64> = ints(me, 9, 4)
        .iter()
        .map(|&v| v as i64 * 3_000_000_000)
        .collect();
    let mut xi64 = up(s, &big);
    comm.all_reduce_in_place(&mut xi64.view_mut(), ReduceOp::Sum, s)
        .unwrap();
    push(
        "all_reduce_in_place i64 sum",
        Vals::I64(down(s, &xi64)),
        Tol::Exact,
    );

    // all_gather (even and uneven).
    let mut g = zeros::<f32>(s, 5 * n);
    let x5 = up(s, &floats(me, 5, 5));
    comm.all_gather(&x5.view(), &mut g.view_mut(), s).unwrap();
    push("all_gather f32", Vals::F32(down(s, &g)), Tol::Exact);
    let counts: Vec<usize> = (0..n).map(|r| r + 1).collect();
    let xv = up(s, &ints(me, counts[me], 6));
    let mut gv = zeros::<i32>(s, counts.iter().sum());
    comm.all_gather_v(&xv.view(), &mut gv.view_mut(), &counts, s)
        .unwrap();
    push("all_gather_v i32", Vals::I32(down(s, &gv)), Tol::Exact);

    // reduce_scatter (even f32 and bf16, uneven f32).
    let m = 11;
    let xr = up(s, &floats(me, m * n, 7));
    let mut yr = zeros::<f32>(s, m);
    comm.reduce_scatter(&xr.view(), &mut yr.view_mut(), ReduceOp::Sum, s)
        .unwrap();
    let all = abs_sum(n, |r| as64(floats(r, m * n, 7)));
    push(
        "reduce_scatter f32 sum",
        Vals::F32(down(s, &yr)),
        Tol::Sum(all[me * m..(me + 1) * m].to_vec()),
    );
    let xrb = up(s, &bf(&floats(me, m * n, 8)));
    let mut yrb = zeros::<bf16>(s, m);
    comm.reduce_scatter(&xrb.view(), &mut yrb.view_mut(), ReduceOp::Sum, s)
        .unwrap();
    let all = abs_sum(n, |r| {
        bf(&floats(r, m * n, 8))
            .iter()
            .map(|b| b.to_f64())
            .collect()
    });
    push(
        "reduce_scatter bf16 sum",
        Vals::Bf16(down(s, &yrb)),
        Tol::Sum(all[me * m..(me + 1) * m].to_vec()),
    );
    let total = 7 * n + 3;
    let rc = even_counts(total, n);
    let xrv = up(s, &floats(me, total, 9));
    let mut yrv = zeros::<f32>(s, rc[me]);
    comm.reduce_scatter_v(&xrv.view(), &mut yrv.view_mut(), &rc, ReduceOp::Sum, s)
        .unwrap();
    let all = abs_sum(n, |r| as64(floats(r, total, 9)));
    let off: usize = rc[..me].iter().sum();
    push(
        "reduce_scatter_v f32 sum",
        Vals::F32(down(s, &yrv)),
        Tol::Sum(all[off..off + rc[me]].to_vec()),
    );

    // broadcast from the last rank.
    let mut b = up(s, &ints(me, 13, 10));
    comm.broadcast(&mut b.view_mut(), n - 1, s).unwrap();
    push("broadcast i32", Vals::I32(down(s, &b)), Tol::Exact);

    // all_to_all and all_to_all_v (counts (i + j) % 3, zeros included).
    let xa = up(s, &floats(me, 3 * n, 11));
    let mut ya = zeros::<f32>(s, 3 * n);
    comm.all_to_all(&xa.view(), &mut ya.view_mut(), s).unwrap();
    push("all_to_all f32", Vals::F32(down(s, &ya)), Tol::Exact);
    // (A world of one sends itself 2: an empty buffer is not the point here.)
    let cnt = |i: usize, j: usize| if n == 1 { 2 } else { (i + j) % 3 };
    let sc: Vec<usize> = (0..n).map(|j| cnt(me, j)).collect();
    let rcv: Vec<usize> = (0..n).map(|j| cnt(j, me)).collect();
    let xav = up(s, &ints(me, sc.iter().sum(), 12));
    let mut yav = zeros::<i32>(s, rcv.iter().sum());
    comm.all_to_all_v(&xav.view(), &sc, &mut yav.view_mut(), &rcv, s)
        .unwrap();
    push("all_to_all_v i32", Vals::I32(down(s, &yav)), Tol::Exact);

    // A ring step and a barrier.
    let xs = up(s, &ints(me, 6, 13));
    let mut ys = zeros::<i32>(s, 6);
    comm.send_recv(
        &xs.view(),
        (me + 1) % n,
        &mut ys.view_mut(),
        (me + n - 1) % n,
        s,
    )
    .unwrap();
    push("send_recv ring i32", Vals::I32(down(s, &ys)), Tol::Exact);
    comm.barrier(s).unwrap();

    // A split by parity, and a collective on it.
    let sub = comm.split((me % 2) as u32, me as u32, s).unwrap();
    let xsub = up(
        s,
        &[
            me as i32 * 10 + 1,
            sub.rank() as i32,
            sub.world_size() as i32,
        ],
    );
    let mut ysub = zeros::<i32>(s, 3);
    sub.all_reduce(&xsub.view(), &mut ysub.view_mut(), ReduceOp::Sum, s)
        .unwrap();
    push(
        "split parity all_reduce",
        Vals::I32(down(s, &ysub)),
        Tol::Exact,
    );
    sub.destroy().unwrap();
    out
}

/// The same program on an in-process CPU world of `n` ranks; rank `me`'s results.
fn cpu_reference(n: usize, me: usize) -> Vec<Step> {
    let comms = CpuWorld::new(n, Duration::from_secs(120)).unwrap();
    let hs: Vec<_> = comms
        .into_iter()
        .map(|c| std::thread::spawn(move || program(&c, &Stream::cpu())))
        .collect();
    let mut all: Vec<Vec<Step>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    all.swap_remove(me)
}

fn check_f32(name: &str, got: &[f32], want: &[f32], tol: &Tol, scale: f64) -> Result<f64, String> {
    if got.len() != want.len() {
        return Err(format!("{name}: {} values, CPU {}", got.len(), want.len()));
    }
    let mut worst = 0f64;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let d = (g as f64 - w as f64).abs();
        let bound = match tol {
            Tol::Exact => 0.0,
            Tol::Sum(a) => scale * a[i],
        };
        let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
        if !same && d > bound {
            return Err(format!(
                "{name}[{i}]: HCCL {g}, CPU {w} (|diff| {d:e} > bound {bound:e})"
            ));
        }
        worst = worst.max(d);
    }
    Ok(worst)
}

/// Compares the HCCL steps with the CPU ones; returns a summary line or what differs.
pub fn compare(n: usize, hccl: &[Step], cpu: &[Step]) -> Result<String, String> {
    if hccl.len() != cpu.len() {
        return Err(format!("{} steps, CPU {}", hccl.len(), cpu.len()));
    }
    let f32_scale = (n.saturating_sub(1)) as f64 * f32::EPSILON as f64;
    let bf16_scale = n as f64 * 2f64.powi(-8);
    let mut worst_f32 = 0f64;
    let mut worst_bf16 = 0f64;
    for (h, c) in hccl.iter().zip(cpu) {
        assert_eq!(h.name, c.name);
        match (&h.vals, &c.vals) {
            (Vals::I32(a), Vals::I32(b)) if a == b => {}
            (Vals::I64(a), Vals::I64(b)) if a == b => {}
            (Vals::F32(a), Vals::F32(b)) => {
                worst_f32 = worst_f32.max(check_f32(h.name, a, b, &h.tol, f32_scale)?);
            }
            (Vals::Bf16(a), Vals::Bf16(b)) => {
                let (a, b): (Vec<f32>, Vec<f32>) = (
                    a.iter().map(|x| x.to_f32()).collect(),
                    b.iter().map(|x| x.to_f32()).collect(),
                );
                worst_bf16 = worst_bf16.max(check_f32(h.name, &a, &b, &h.tol, bf16_scale)?);
            }
            (a, b) => return Err(format!("{}: HCCL {a:?}\nCPU {b:?}", h.name)),
        }
    }
    Ok(format!(
        "{} steps equal to the CPU communicator's (largest |diff|: f32 {worst_f32:e}, bf16 \
         {worst_bf16:e})",
        hccl.len()
    ))
}

/// A child rank: the program on HCCL, then on the CPU, compared.
pub fn rank_main() {
    let comm = Communicator::hccl_from_env(Duration::from_secs(60)).unwrap();
    let (me, n) = (comm.rank(), comm.world_size());
    assert_eq!(comm.device(), cannon_runtime::Device::Npu(me as u32));
    let stream = Stream::new(comm.device()).unwrap();
    let hccl = program(&comm, &stream);
    comm.check_async_error().unwrap();
    comm.destroy().unwrap();
    let cpu = cpu_reference(n, me);
    match compare(n, &hccl, &cpu) {
        Ok(line) => println!("CANNON_CHECKS rank {me} of {n}: {line}"),
        Err(e) => panic!("rank {me} of {n}: {e}"),
    }
}
