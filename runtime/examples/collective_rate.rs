//! Collective throughput of the in-process CPU communicator (a measurement, not a test):
//! `cargo run -p cannon-runtime --release --example collective_rate`.
//!
//! FSDP-sized flat buffers: 16 MiB of f32 gathered / reduce-scattered / all-reduced per rank,
//! plus the latency of a 1-element all_reduce, for worlds of 2, 4 and 8 thread ranks.

use cannon_runtime::comm::{CpuWorld, ReduceOp};
use cannon_runtime::{DeviceBuffer, Stream};
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    for world in [2usize, 4, 8] {
        let total = 4 << 20;
        let shard = total / world;
        let reps = 10u32;
        let comms = CpuWorld::new(world, Duration::from_secs(60))?;
        let times = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|c| {
                    s.spawn(
                        move || -> Result<_, Box<dyn std::error::Error + Send + Sync>> {
                            let st = Stream::cpu();
                            let send = DeviceBuffer::clone_htod(&st, &vec![1.0f32; shard])?;
                            let mut full = DeviceBuffer::<f32>::alloc_zeros(&st, total)?;
                            let mut out = DeviceBuffer::<f32>::alloc_zeros(&st, shard)?;
                            c.barrier(&st)?;
                            let t = Instant::now();
                            for _ in 0..reps {
                                c.all_gather(&send.view(), &mut full.view_mut(), &st)?;
                            }
                            let ag = t.elapsed() / reps;
                            c.barrier(&st)?;
                            let t = Instant::now();
                            for _ in 0..reps {
                                c.reduce_scatter(
                                    &full.view(),
                                    &mut out.view_mut(),
                                    ReduceOp::Sum,
                                    &st,
                                )?;
                            }
                            let rs = t.elapsed() / reps;
                            c.barrier(&st)?;
                            let t = Instant::now();
                            for _ in 0..reps {
                                c.all_reduce_in_place(&mut full.view_mut(), ReduceOp::Sum, &st)?;
                            }
                            let ar = t.elapsed() / reps;
                            c.barrier(&st)?;
                            let small = 1000u32;
                            let mut x = DeviceBuffer::clone_htod(&st, &[1.0f32])?;
                            let t = Instant::now();
                            for _ in 0..small {
                                c.all_reduce_in_place(&mut x.view_mut(), ReduceOp::Sum, &st)?;
                            }
                            Ok((ag, rs, ar, t.elapsed() / small))
                        },
                    )
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("rank thread panicked"))
                .collect::<Vec<_>>()
        });
        let (ag, rs, ar, lat) = times.into_iter().next().ok_or("no ranks")??;
        let mib = (total * 4) as f64 / (1 << 20) as f64;
        println!(
            "world {world}: {mib} MiB f32 per rank: all_gather {ag:?}, reduce_scatter {rs:?}, \
             all_reduce {ar:?}; 1-element all_reduce {lat:?}"
        );
    }
    Ok(())
}
