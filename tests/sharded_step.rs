//! Whole-stack check through the facade: a ZeRO-style sharded data-parallel training step over
//! in-process CPU ranks (runtime buffers + communicator + kernels) equals the one-rank step.
//!
//! The model is one linear layer with softmax cross-entropy (the lm_head of the trainer in
//! miniature). Each rank takes a contiguous slice of the rows, computes its partial weight
//! gradient, reduce-scatters it (sum) onto uneven flat shards, runs AdamW on its shard and
//! all-gathers the updated weights: the FSDP step of DESIGN.md.

use cannon::kernels::adamw::{host::adamw_step, AdamW};
use cannon::kernels::cross_entropy::{host::cross_entropy, LossNorm, IGNORE_INDEX};
use cannon::kernels::linear::{
    host::linear_backward, host::linear_forward, LinearDims, LinearGrads,
};
use cannon::kernels::testutil::{rel_l2, Rng};
use cannon::kernels::Precision;
use cannon::runtime::comm::{even_counts, CpuWorld, ReduceOp};
use cannon::runtime::{CachingAllocator, DeviceBuffer, Stream};
use std::time::Duration;

const N: usize = 13; // rows (tokens)
const D: usize = 7; // in features
const V: usize = 11; // classes
const STEPS: u64 = 3;

struct Problem {
    x: Vec<f32>,
    labels: Vec<i32>,
    w0: Vec<f32>,
}

fn problem() -> Problem {
    let mut rng = Rng::new(42);
    let x = rng.normal_vec(N * D, 1.0);
    let w0 = rng.normal_vec(V * D, 0.5);
    let labels = (0..N)
        .map(|i| {
            if i % 5 == 3 {
                IGNORE_INDEX
            } else {
                rng.below(V) as i32
            }
        })
        .collect();
    Problem { x, labels, w0 }
}

fn hp() -> AdamW {
    AdamW {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    }
}

/// Loss and dW of rows `rows` with the loss divided by `divisor` (the whole batch's labels).
fn partial_grad(
    p: &Problem,
    w: &[f32],
    rows: std::ops::Range<usize>,
    divisor: f64,
) -> (f64, Vec<f32>) {
    let t = rows.len();
    let d = LinearDims {
        t,
        d_in: D,
        d_out: V,
    };
    let x = &p.x[rows.start * D..rows.end * D];
    let mut logits = vec![0.0; t * V];
    linear_forward(Precision::F32, &mut logits, x, w, None, d).unwrap();
    let mut dlogits = vec![0.0; t * V];
    let stats = cross_entropy(
        &logits,
        &p.labels[rows],
        V,
        Some(&mut dlogits),
        LossNorm::Divisor(divisor),
    )
    .unwrap();
    let mut dw = vec![0.0; V * D];
    linear_backward(
        Precision::F32,
        LinearGrads {
            dx: None,
            dw: Some(&mut dw),
            db: None,
        },
        &dlogits,
        x,
        w,
        d,
    )
    .unwrap();
    (stats.sum, dw)
}

fn count(p: &Problem) -> f64 {
    p.labels.iter().filter(|&&l| l != IGNORE_INDEX).count() as f64
}

/// The reference: one rank, the whole batch.
fn single_rank(p: &Problem) -> (Vec<f64>, Vec<f32>) {
    let mut w = p.w0.clone();
    let (mut m, mut v) = (vec![0.0; w.len()], vec![0.0; w.len()]);
    let mut losses = Vec::new();
    for step in 1..=STEPS {
        let (sum, dw) = partial_grad(p, &w, 0..N, count(p));
        losses.push(sum / count(p));
        adamw_step(&mut w, &dw, &mut m, &mut v, step, &hp()).unwrap();
    }
    (losses, w)
}

/// `world` ranks, rows split contiguously, weights and optimizer state sharded unevenly.
fn sharded(p: &Problem, world: usize) -> Vec<(Vec<f64>, Vec<f32>)> {
    let comms = CpuWorld::new(world, Duration::from_secs(10)).unwrap();
    let row_counts = even_counts(N, world);
    let shard_counts = even_counts(V * D, world);
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let (row_counts, shard_counts) = (&row_counts, &shard_counts);
                s.spawn(move || {
                    let r = comm.rank();
                    let row0: usize = row_counts[..r].iter().sum();
                    let rows = row0..row0 + row_counts[r];
                    let off: usize = shard_counts[..r].iter().sum();
                    let len = shard_counts[r];
                    // The rank's master shard and optimizer state live in runtime buffers.
                    let alloc = CachingAllocator::new_cpu();
                    let mut master = DeviceBuffer::<f32>::alloc_in(&alloc, len).unwrap();
                    master
                        .as_host_slice_mut()
                        .unwrap()
                        .copy_from_slice(&p.w0[off..off + len]);
                    let mut m = DeviceBuffer::<f32>::alloc_zeros_in(&alloc, len).unwrap();
                    let mut v = DeviceBuffer::<f32>::alloc_zeros_in(&alloc, len).unwrap();
                    let st = Stream::cpu();
                    let mut w_full = DeviceBuffer::<f32>::alloc_zeros_in(&alloc, V * D).unwrap();
                    let mut g = DeviceBuffer::<f32>::alloc_zeros_in(&alloc, len).unwrap();
                    let mut losses = Vec::new();
                    for step in 1..=STEPS {
                        comm.all_gather_v(
                            &master.view(),
                            &mut w_full.view_mut(),
                            shard_counts,
                            &st,
                        )
                        .unwrap();
                        // The loss divisor is the whole batch's label count, summed over ranks.
                        let mine = p.labels[rows.clone()]
                            .iter()
                            .filter(|&&l| l != IGNORE_INDEX)
                            .count();
                        let mut total = DeviceBuffer::clone_htod(&st, &[mine as i64]).unwrap();
                        comm.all_reduce_in_place(&mut total.view_mut(), ReduceOp::Sum, &st)
                            .unwrap();
                        let total = total.clone_dtoh(&st).unwrap()[0] as f64;
                        let (sum, dw) =
                            partial_grad(p, w_full.as_host_slice().unwrap(), rows.clone(), total);
                        let mut loss = DeviceBuffer::clone_htod(&st, &[sum]).unwrap();
                        comm.all_reduce_in_place(&mut loss.view_mut(), ReduceOp::Sum, &st)
                            .unwrap();
                        losses.push(loss.clone_dtoh(&st).unwrap()[0] / total);
                        let dw = DeviceBuffer::clone_htod(&st, &dw).unwrap();
                        comm.reduce_scatter_v(
                            &dw.view(),
                            &mut g.view_mut(),
                            shard_counts,
                            ReduceOp::Sum,
                            &st,
                        )
                        .unwrap();
                        adamw_step(
                            master.as_host_slice_mut().unwrap(),
                            g.as_host_slice().unwrap(),
                            m.as_host_slice_mut().unwrap(),
                            v.as_host_slice_mut().unwrap(),
                            step,
                            &hp(),
                        )
                        .unwrap();
                    }
                    comm.all_gather_v(&master.view(), &mut w_full.view_mut(), shard_counts, &st)
                        .unwrap();
                    let w_full = w_full.clone_dtoh(&st).unwrap();
                    (losses, w_full)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn sharded_data_parallel_step_equals_single_rank() {
    let p = problem();
    let (ref_losses, ref_w) = single_rank(&p);
    for world in [1, 2, 3, 4] {
        for (rank, (losses, w)) in sharded(&p, world).into_iter().enumerate() {
            // Only the order of the f32 partial-gradient sums differs (a few ulp); AdamW's
            // first steps are near sign(g) updates, so the weights agree to ~1e-6 relative.
            let dw = rel_l2(&w, &ref_w);
            assert!(
                dw <= 1e-5,
                "world {world} rank {rank}: weights rel L2 {dw:e}"
            );
            // Losses: per-row sums in f64, so only the f32 logits' rounding differs.
            let dl = rel_l2(&losses, &ref_losses);
            assert!(
                dl <= 1e-6,
                "world {world} rank {rank}: losses rel L2 {dl:e}"
            );
        }
    }
    // The step did something: the weights moved and the loss went down.
    assert!(rel_l2(&ref_w, &p.w0) > 1e-3);
    assert!(ref_losses[STEPS as usize - 1] < ref_losses[0]);
}
