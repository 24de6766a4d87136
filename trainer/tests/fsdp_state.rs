//! A sharded run's state (parameter, moment shards and step count per rank): resumed on the
//! same world size it continues bit for bit; recut for another world size (2 -> 4, 2 -> 1)
//! it continues the same curve up to the order of the f32 gradient sums.

mod fsdp_fixture;

use cannon_trainer::model::batch::Batch;
use cannon_trainer::model::{Mistral3Config, ParamLayout, Part};
use cannon_trainer::parallel::fsdp::{
    run_cpu_ranks, FsdpRank, FsdpSettings, ShardState, StepStats,
};
use fsdp_fixture::*;
use std::time::Duration;

/// `steps` steps on `world` ranks, starting from `states` (one per rank) if given; returns
/// rank 0's stats, the final full parameters and every rank's final state.
fn run(
    world: usize,
    cfg: &Mistral3Config,
    host: &[Vec<f32>],
    batches: &[Batch],
    s: &FsdpSettings,
    steps: usize,
    states: Option<&[ShardState]>,
) -> (Vec<StepStats>, Vec<Vec<f32>>, Vec<ShardState>) {
    let out = run_cpu_ranks(world, Duration::from_secs(20), |comm, exec| {
        let r = comm.rank();
        let mut rank = FsdpRank::new(
            comm,
            exec,
            cfg.clone(),
            cannon_trainer::parallel::fsdp::ShardSource::Full(host),
            s.clone(),
        )?;
        if let Some(states) = states {
            rank.load_state(&states[r])?;
        }
        let mine: Vec<Batch> = batches.iter().skip(r).step_by(world).cloned().collect();
        let stats = (0..steps)
            .map(|_| rank.step::<f32>(&mine, s.adamw.lr))
            .collect::<Result<Vec<_>, _>>()?;
        let params = rank.gather_full_params()?.to_host(rank.exec().stream())?;
        Ok((stats, params, rank.state()?))
    })
    .unwrap();
    let states = out.iter().map(|o| o.2.clone()).collect();
    let (stats, params, _) = out.into_iter().next().unwrap();
    (stats, params, states)
}

fn losses(stats: &[StepStats]) -> Vec<f64> {
    stats.iter().map(|s| s.loss).collect()
}

#[test]
fn resume_continues_bit_for_bit_and_reshards() {
    let cfg = config();
    let layout = ParamLayout::new(&cfg);
    let host = init(&cfg, 21);
    let batches = global_batch(4, 8);
    let s = settings(&[Part::Vision]);
    let (all, final_params, _) = run(2, &cfg, &host, &batches, &s, 6, None);
    let (first, _, saved) = run(2, &cfg, &host, &batches, &s, 3, None);
    assert_eq!(losses(&first), losses(&all[..3]));
    assert!(saved.iter().all(|st| st.step == 3));

    // Same world size: the same losses and weights, bit for bit.
    let (rest, params, _) = run(2, &cfg, &host, &batches, &s, 3, Some(&saved));
    assert_eq!(losses(&rest), losses(&all[3..]));
    assert_eq!(params, final_params);
    assert_eq!(rest.iter().map(|s| s.step).collect::<Vec<_>>(), [4, 5, 6]);

    // A recut moves values only: 2 -> 4 -> 2 gives the saved states back.
    let four = ShardState::reshard(&saved, &layout, 4).unwrap();
    assert_eq!(ShardState::reshard(&four, &layout, 2).unwrap(), saved);

    // Other world sizes continue the curve; only the order of the f32 gradient sums over
    // micro batches and ranks differs (the bar of the 1 vs N test).
    for (world, states) in [
        (4, four),
        (1, ShardState::reshard(&saved, &layout, 1).unwrap()),
    ] {
        let (rest, params, _) = run(world, &cfg, &host, &batches, &s, 3, Some(&states));
        let d = loss_diff(&losses(&rest), &losses(&all[3..]));
        let dp = rel_l2(&params, &final_params);
        assert!(
            d <= 1e-5 && dp <= 1e-5,
            "2 -> {world} ranks: loss {d:e}, params {dp:e}"
        );
    }
}

#[test]
fn a_state_of_another_world_is_an_error_naming_both() {
    let cfg = config();
    let layout = ParamLayout::new(&cfg);
    let host = init(&cfg, 21);
    let batches = global_batch(2, 8);
    let s = settings(&[]);
    let (_, _, saved) = run(2, &cfg, &host, &batches, &s, 1, None);
    let err = run_cpu_ranks(1, Duration::from_secs(20), |comm, exec| {
        let mut rank = FsdpRank::new(
            comm,
            exec,
            cfg.clone(),
            cannon_trainer::parallel::fsdp::ShardSource::Full(&host),
            s.clone(),
        )?;
        rank.load_state(&saved[0])
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("rank 0 of 2") && err.contains("rank 0 of 1"),
        "{err}"
    );
    // Ranks out of order, or a frozen group's state where moments are expected.
    let swapped = [saved[1].clone(), saved[0].clone()];
    assert!(ShardState::reshard(&swapped, &layout, 1).is_err());
    let mut no_moments = saved.clone();
    no_moments[1].groups[5].m = None;
    let err = ShardState::reshard(&no_moments, &layout, 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("rank 1, group 5"), "{err}");
}
