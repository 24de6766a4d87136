//! Throughput figures (ignored by default; run with
//! `cargo test -p cannon-runtime --release --test collectives throughput -- --ignored --nocapture`).
//! Not assertions: the machine is shared, so the numbers are indicative only.

use std::time::Instant;

use cannon_runtime::comm::ReduceOp;

use crate::common::*;

#[test]
#[ignore]
fn throughput() {
    for world in [2usize, 4, 8] {
        // FSDP-sized flat buffers: 16 MiB of f32 gathered / reduce-scattered per rank.
        let total = 4 << 20;
        let shard = total / world;
        let reps = 10;
        let times = run_world(world, GENEROUS, |c| {
            let send = vec![1.0f32; shard];
            let mut full = vec![0.0f32; total];
            let mut out = vec![0.0f32; shard];
            c.barrier().unwrap();
            let t = Instant::now();
            for _ in 0..reps {
                c.all_gather(&send, &mut full).unwrap();
            }
            let ag = t.elapsed() / reps;
            c.barrier().unwrap();
            let t = Instant::now();
            for _ in 0..reps {
                c.reduce_scatter(&full, &mut out, ReduceOp::Sum).unwrap();
            }
            let rs = t.elapsed() / reps;
            c.barrier().unwrap();
            let t = Instant::now();
            for _ in 0..reps {
                c.all_reduce_in_place(&mut full, ReduceOp::Sum).unwrap();
            }
            let ar = t.elapsed() / reps;
            c.barrier().unwrap();
            let t = Instant::now();
            let small = 1000;
            let mut x = [1.0f32];
            for _ in 0..small {
                c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
            }
            (ag, rs, ar, t.elapsed() / small)
        });
        let (ag, rs, ar, lat) = times[0];
        let mib = (total * 4) as f64 / (1 << 20) as f64;
        println!(
            "world {world}: {mib} MiB f32 per rank: all_gather {ag:?}, reduce_scatter {rs:?}, \
             all_reduce {ar:?}; 1-element all_reduce {lat:?}"
        );
    }
}
