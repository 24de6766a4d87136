//! FSDP over in-process CPU ranks against the unsharded model: the same global batch on 1, 2
//! and 4 ranks gives the same loss curve and final weights, every rank's resident memory is
//! its 1/N share (plus padding), the model fetches exactly the groups its plan names, and a
//! bad batch on one rank stops every rank with an error naming it.

mod fsdp_fixture;

use cannon_runtime::alloc::round_size;
use cannon_trainer::model::{ParamLayout, Part};
use cannon_trainer::parallel::fsdp::{run_cpu_ranks, FsdpError, FsdpRank, ShardLayout};
use fsdp_fixture::*;
use std::time::Duration;

const STEPS: usize = 50;

/// 1 vs 2 vs 4 ranks, 50 steps, 4 micro batches (one without images, one packed), every part
/// training. Ranks change only the order of f32 sums (each rank's gradient is summed over its
/// own micro batches, then over ranks by the reduce-scatter; the loss sums are f64), so the
/// curves agree to float rounding amplified by 50 AdamW steps.
#[test]
fn one_two_and_four_ranks_train_alike() {
    let cfg = config();
    let host = init(&cfg, 7);
    let batches = global_batch(4, 11);
    let s = settings(&[]);
    let (ref_losses, _, ref_params) = run_unsharded(&cfg, &host, &batches, &s, STEPS);
    assert!(
        ref_losses[STEPS - 1] < 0.5 * ref_losses[0],
        "the reference learns: {} -> {}",
        ref_losses[0],
        ref_losses[STEPS - 1]
    );
    let mut l1 = None;
    for world in [1, 2, 4] {
        let run = run_sharded::<f32>(world, &cfg, &host, &batches, &s, STEPS);
        let losses: Vec<f64> = run.stats.iter().map(|s| s.loss).collect();
        let l1 = l1.get_or_insert_with(|| losses.clone());
        // The bar of the issue: normalised mean absolute loss difference <= 1e-5 against one
        // rank, and against the unsharded model.
        let (d1, dref) = (loss_diff(&losses, l1), loss_diff(&losses, &ref_losses));
        eprintln!("world {world}: loss diff vs 1 rank {d1:.3e}, vs unsharded {dref:.3e}");
        assert!(d1 <= 1e-5, "world {world}: loss diff vs 1 rank {d1:e}");
        assert!(
            dref <= 1e-5,
            "world {world}: loss diff vs unsharded {dref:e}"
        );
        // Final weights: after 50 steps of lr 3e-3 the weights moved by several percent (rel.
        // L2, checked below); f32 rounding of the summed gradients, amplified by AdamW's
        // division by sqrt(v) on small gradients, leaves them 1.3e-7 (1 and 4 ranks) and
        // 1.4e-7 (2 ranks) apart on the machine this was written on. 1e-5 leaves ~70x for
        // other GEMM kernels' rounding and still fails on any real error (a micro batch lost
        // or counted twice moves them by >1e-3).
        let dp = rel_l2(&run.params, &ref_params);
        eprintln!("world {world}: final params rel L2 vs unsharded {dp:.3e}");
        assert!(dp <= 1e-5, "world {world}: final params rel L2 {dp:e}");
        for st in &run.stats {
            assert_eq!(st.passes, 4usize.div_ceil(world));
            assert!(st.grad_norm.is_finite() && st.grad_norm > 0.0);
        }
    }
    let moved = rel_l2(&ref_params, &host);
    assert!(moved > 1e-2, "the weights moved: {moved:e}");
}

/// Mixed precision (bf16 activations and GEMM operands, f32 master weights, f32 gradient
/// reduce-scatter): 2 ranks step like 1. The ranks compute the same bf16 products on the same
/// micro batches; only the f32 sums of gradients over micro batches and ranks are ordered
/// differently, but a master weight one f32 ulp away can round to the neighbouring bf16 value
/// (2^-8 relative) in the GEMMs of later steps, so the f32 differences grow to bf16 rounding:
/// measured 3.5e-5 over 20 steps. The bar, 1e-3, keeps ~30x margin and is 20x under the
/// issue's bf16-vs-f32 bar (2 %).
#[test]
fn bf16_two_ranks_train_like_one() {
    let cfg = config();
    let host = init(&cfg, 7);
    let batches = global_batch(4, 11);
    let s = settings(&[Part::Vision]);
    let one = run_sharded::<half::bf16>(1, &cfg, &host, &batches, &s, 20);
    let two = run_sharded::<half::bf16>(2, &cfg, &host, &batches, &s, 20);
    let (l1, l2): (Vec<f64>, Vec<f64>) = (
        one.stats.iter().map(|s| s.loss).collect(),
        two.stats.iter().map(|s| s.loss).collect(),
    );
    let d = loss_diff(&l2, &l1);
    eprintln!("bf16: 2 vs 1 rank loss diff {d:.3e}");
    assert!(d <= 1e-3, "bf16 loss diff {d:e}");
    assert!(l1[19] < 0.7 * l1[0], "bf16 learns: {} -> {}", l1[0], l1[19]);
}

/// One rank, one micro batch: the world of one is the unsharded step bit for bit (its
/// gathers and reduce-scatter are its own groups in place, the loss divisor is the batch's
/// own count).
#[test]
fn one_rank_is_the_unsharded_step_bit_for_bit() {
    let cfg = config();
    let host = init(&cfg, 3);
    let batch = global_batch(1, 5).remove(0);
    let s = settings(&[Part::Vision, Part::Projector]);
    let (losses, norms, params) = run_unsharded(&cfg, &host, std::slice::from_ref(&batch), &s, 5);
    let run = run_sharded::<f32>(1, &cfg, &host, &[batch], &s, 5);
    let got: Vec<f64> = run.stats.iter().map(|s| s.loss).collect();
    assert_eq!(got, losses);
    let got: Vec<f64> = run.stats.iter().map(|s| s.grad_norm).collect();
    assert_eq!(got, norms);
    assert_eq!(run.params, params);
}

/// Per-rank memory before a step: parameter shards of every group plus gradient and two
/// moment shards of the trained ones, each `ceil(len / N)` floats rounded to the allocator's
/// 512-byte blocks, on the rank's own allocator: the 1-rank bytes over N plus at most one
/// block of padding per buffer. The step's peak also falls (activations are not sharded,
/// so not as 1/N).
#[test]
fn resident_memory_per_rank_falls_as_one_over_n() {
    let cfg = config();
    let host = init(&cfg, 7);
    let batches = global_batch(4, 11);
    let frozen = [Part::Vision];
    let s = settings(&frozen);
    let layout = ParamLayout::new(&cfg);
    let mut one = 0;
    for world in [1, 2, 4] {
        let run = run_sharded::<f32>(world, &cfg, &host, &batches, &s, 1);
        let cut = ShardLayout::new(&layout, world);
        let buffers: usize = layout
            .groups
            .iter()
            .map(|g| if frozen.contains(&g.part) { 1 } else { 4 })
            .sum();
        let want: usize = layout
            .groups
            .iter()
            .zip(&cut.groups)
            .map(|(g, c)| {
                let n = if frozen.contains(&g.part) { 1 } else { 4 };
                n * round_size(4 * c.shard)
            })
            .sum();
        if world == 1 {
            one = want;
        }
        for (r, &bytes) in run.resident.iter().enumerate() {
            assert_eq!(bytes, want, "world {world} rank {r}: resident bytes");
            assert!(
                bytes <= one / world + buffers * (512 + 4),
                "world {world} rank {r}: {bytes} B is not 1/{world} of {one} B"
            );
        }
        eprintln!(
            "world {world}: resident {} B per rank (1 rank: {one} B), step peak per rank {:?} B",
            run.resident[0], run.peak
        );
        assert!(run.peak.iter().all(|&p| p > want));
    }
}

/// The model fetches and releases exactly the groups of its plan, in order: on one rank
/// (no peers) any group the plan names but the pass skips would be a gather or a
/// reduce-scatter "for the peers", and a group out of plan is an error. Every freezing the
/// trainer uses, with and without images, whole and chunked loss.
#[test]
fn passes_follow_their_plan_exactly() {
    let cfg = config();
    let host = init(&cfg, 1);
    let batches = global_batch(3, 2);
    let frozen_sets: [&[Part]; 5] = [
        &[],
        &[Part::Vision],
        &[Part::Vision, Part::Projector],
        &[Part::Projector, Part::Text],
        &[Part::Vision, Part::Projector, Part::Text],
    ];
    for frozen in frozen_sets {
        for loss_mode in [
            cannon_trainer::model::LossMode::Full,
            cannon_trainer::model::LossMode::Chunked(7),
        ] {
            let mut s = settings(frozen);
            s.loss_mode = loss_mode;
            let run = run_sharded::<f32>(1, &cfg, &host, &batches, &s, 1);
            assert_eq!(run.stats[0].for_peers, 0, "frozen {frozen:?} {loss_mode:?}");
        }
    }
    // With more ranks, a rank whose micro batch has no image gathers the vision groups and
    // reduce-scatters their (zero) gradients for its peers: 2 ranks, micro batch 1 (rank 1)
    // has none. Forward: vision embed, 2 layers, projector (4 gathers); backward: the same 4
    // groups gathered and reduce-scattered (8).
    let run = run_sharded::<f32>(2, &cfg, &host, &batches[..2], &settings(&[]), 1);
    assert_eq!(run.for_peers, [0, 12]);
}

/// Three micro batches on two ranks: rank 1 runs an empty second pass (only collectives) and
/// the step still equals the unsharded one.
#[test]
fn uneven_micro_batch_counts_step_alike() {
    let cfg = config();
    let host = init(&cfg, 4);
    let batches = global_batch(3, 9);
    let s = settings(&[Part::Vision]);
    let (ref_losses, _, ref_params) = run_unsharded(&cfg, &host, &batches, &s, 3);
    let run = run_sharded::<f32>(2, &cfg, &host, &batches, &s, 3);
    let losses: Vec<f64> = run.stats.iter().map(|s| s.loss).collect();
    assert!(loss_diff(&losses, &ref_losses) <= 1e-6);
    assert!(rel_l2(&run.params, &ref_params) <= 1e-5);
    assert_eq!(run.stats[0].passes, 2);
}

/// A micro batch that one rank rejects (more `[IMG]` tokens than images) stops every rank
/// before any pass, and the error names the rank and the batch.
#[test]
fn a_bad_batch_on_one_rank_fails_every_rank_with_its_name() {
    let cfg = config();
    let host = init(&cfg, 4);
    let mut batches = global_batch(2, 9);
    batches[1].input_ids[2] = IMG;
    let s = settings(&[]);
    let err = run_cpu_ranks(2, Duration::from_secs(20), |comm, exec| {
        let r = comm.rank();
        let mut rank = FsdpRank::new(
            comm,
            exec,
            cfg.clone(),
            cannon_trainer::parallel::fsdp::ShardSource::Full(&host),
            s.clone(),
        )?;
        rank.step::<f32>(&batches[r..r + 1], 1e-3)
    })
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            FsdpError::Batch {
                rank: 1,
                index: 0,
                ..
            }
        ),
        "{msg}"
    );
    assert!(msg.contains("rank 1") && msg.contains("[IMG]"), "{msg}");
}

/// Wrong host groups are an error naming the mismatch, not a panic.
#[test]
fn wrong_initial_groups_are_an_error() {
    let cfg = config();
    let mut host = init(&cfg, 4);
    host[3].pop();
    let s = settings(&[]);
    let err = run_cpu_ranks(2, Duration::from_secs(20), |comm, exec| {
        FsdpRank::new(
            comm,
            exec,
            cfg.clone(),
            cannon_trainer::parallel::fsdp::ShardSource::Full(&host),
            s.clone(),
        )
        .map(|_| ())
    })
    .unwrap_err();
    assert!(err.to_string().contains("group 3"), "{err}");
}

/// A step whose gradient holds an inf on one rank only is skipped by every rank: its shards,
/// moments and AdamW step count are as before it (on 1 and 2 ranks), and the step after goes
/// on exactly as a run in which the skipped step never happened.
#[test]
fn an_inf_gradient_on_one_rank_is_skipped_by_every_rank() {
    let cfg = config();
    let host = init(&cfg, 7);
    let batches = global_batch(4, 11);
    let s = settings(&[]);
    let lr = s.adamw.lr;
    for world in [1, 2] {
        let clean = run_sharded::<f32>(world, &cfg, &host, &batches, &s, 2);
        let per_rank = run_cpu_ranks(world, Duration::from_secs(20), |comm, exec| {
            let r = comm.rank();
            let mut rank = FsdpRank::new(
                comm,
                exec,
                cfg.clone(),
                cannon_trainer::parallel::fsdp::ShardSource::Full(&host),
                s.clone(),
            )?;
            let mine: Vec<_> = batches.iter().skip(r).step_by(world).cloned().collect();
            let first = rank.step::<f32>(&mine, lr)?;
            let before = rank.state()?;
            if r + 1 == world {
                rank.inject_inf_gradient();
            }
            let poisoned = rank.step::<f32>(&mine, lr)?;
            let after = rank.state()?;
            let next = rank.step::<f32>(&mine, lr)?;
            Ok((first, poisoned, next, before == after))
        })
        .unwrap();
        for (r, (first, poisoned, next, unchanged)) in per_rank.iter().enumerate() {
            assert!(!first.skipped && !next.skipped, "world {world} rank {r}");
            assert!(poisoned.skipped, "world {world} rank {r}: not skipped");
            assert!(poisoned.grad_norm.is_infinite(), "{}", poisoned.grad_norm);
            assert!(poisoned.loss.is_finite(), "the loss itself was fine");
            assert!(
                *unchanged,
                "world {world} rank {r}: the skipped step changed the state"
            );
            assert_eq!(poisoned.step, first.step);
            assert_eq!(next.step, first.step + 1);
            // The batches are the same every step: the step after the skipped one is the
            // clean run's second step, bit for bit.
            assert_eq!(next.loss, clean.stats[1].loss, "world {world} rank {r}");
            assert_eq!(next.grad_norm, clean.stats[1].grad_norm);
        }
    }
}
