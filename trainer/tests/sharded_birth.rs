//! Ranks sharded from birth: every rank reads or draws only its own shards, and the model
//! they hold together does not depend on how many there are. With 1, 2 and 4 ranks: random
//! init gives the bit-identical weights of the one-process draw; an HF checkpoint's byte
//! ranges give the one-process load; the final model streamed group by group is the same
//! file, byte for byte, as one process writes; and each rank's allocator holds 1/N of the
//! training state (weights, gradients, two moments).

mod fsdp_fixture;

use cannon_trainer::model::hf_write::write_hf;
use cannon_trainer::model::init::{random_host, Init, INITIALIZER_RANGE};
use cannon_trainer::model::weights::{load_host, HfWeights};
use cannon_trainer::model::{ParamLayout, Part};
use cannon_trainer::parallel::fsdp::{run_cpu_ranks, FsdpRank, ShardLayout, ShardSource};
use fsdp_fixture::*;
use std::path::PathBuf;
use std::time::Duration;

fn scratch(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cannon-birth-{}-{test}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn bits(groups: &[Vec<f32>]) -> Vec<Vec<u32>> {
    groups
        .iter()
        .map(|g| g.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// The full weights `world` ranks built from `source` hold together (gathered).
fn gathered(world: usize, source: ShardSource<'_>) -> Vec<Vec<f32>> {
    let cfg = config();
    let s = settings(&[]);
    let out = run_cpu_ranks(world, Duration::from_secs(60), |comm, exec| {
        let rank = FsdpRank::new(comm, exec, cfg.clone(), source, s.clone())?;
        Ok(rank.gather_full_params()?.to_host(rank.exec().stream())?)
    })
    .unwrap();
    out.into_iter().next().unwrap()
}

#[test]
fn random_init_is_the_same_on_any_number_of_ranks() {
    let layout = ParamLayout::new(&config());
    for init in [Init::FanIn, Init::Normal(INITIALIZER_RANGE)] {
        let want = bits(&random_host(&layout, 42, init));
        for world in [1, 2, 4] {
            let got = gathered(world, ShardSource::Random { seed: 42, init });
            assert_eq!(bits(&got), want, "{world} ranks, {init:?}");
        }
    }
    // Another seed is another model.
    let other = bits(&random_host(&layout, 43, Init::FanIn));
    assert_ne!(other, bits(&random_host(&layout, 42, Init::FanIn)));
}

#[test]
fn hf_weights_are_read_by_ranges_into_the_loaded_model() {
    let dir = scratch("hf");
    let cfg = config();
    let layout = ParamLayout::new(&cfg);
    let host = init(&cfg, 5);
    write_hf(&dir, &layout, &serde_json::json!({}), &host).unwrap();
    let want = bits(&load_host(&dir, &layout).unwrap());
    assert_eq!(want, bits(&host));
    let w = HfWeights::open(&dir, &layout).unwrap();
    for world in [1, 2, 4] {
        let got = gathered(world, ShardSource::Weights(&w));
        assert_eq!(bits(&got), want, "{world} ranks");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The final model N ranks stream group by group is the file one process writes.
#[test]
fn the_streamed_export_is_byte_identical_on_any_number_of_ranks() {
    let root = scratch("export");
    let cfg = config();
    let layout = ParamLayout::new(&cfg);
    let host = random_host(&layout, 9, Init::FanIn);
    let json = serde_json::json!({"model_type": "mistral3"});
    let one = root.join("one");
    write_hf(&one, &layout, &json, &host).unwrap();
    let want = std::fs::read(one.join("model.safetensors")).unwrap();
    let s = settings(&[]);
    for world in [1, 2, 4] {
        let out = root.join(format!("ranks{world}"));
        run_cpu_ranks(world, Duration::from_secs(60), |comm, exec| {
            let r = comm.rank();
            let source = ShardSource::Random {
                seed: 9,
                init: Init::FanIn,
            };
            let rank = FsdpRank::new(comm, exec, cfg.clone(), source, s.clone())?;
            rank.write_hf((r == 0).then_some((out.as_path(), &json)))
        })
        .unwrap();
        let got = std::fs::read(out.join("model.safetensors")).unwrap();
        assert!(got == want, "{world} ranks: the file differs");
        assert!(!out.join("model.safetensors.partial").exists());
    }
    std::fs::remove_dir_all(&root).ok();
}

/// What a rank's allocator holds after start-up: its shard of the weights and of the
/// trained groups' gradient and two moments, nothing of the whole model; so 1/N of one
/// rank's figure (to the padding of the last shards and the allocator's rounding).
#[test]
fn a_ranks_start_up_memory_is_its_share_of_the_state() {
    let cfg = config();
    let layout = ParamLayout::new(&cfg);
    let frozen = [Part::Vision];
    let s = settings(&frozen);
    let trained = |g: usize| !frozen.contains(&layout.groups[g].part);
    let held = |world: usize| -> Vec<usize> {
        run_cpu_ranks(world, Duration::from_secs(60), |comm, exec| {
            let source = ShardSource::Random {
                seed: 1,
                init: Init::FanIn,
            };
            let rank = FsdpRank::new(comm, exec, cfg.clone(), source, s.clone())?;
            Ok(rank.exec().allocator().stats().allocated)
        })
        .unwrap()
    };
    for world in [1usize, 2, 4] {
        let cut = ShardLayout::new(&layout, world);
        // f32 weights of every group, gradient + 2 moments of the trained ones.
        let state: usize = (0..layout.groups.len())
            .map(|g| cut.groups[g].shard * 4 * if trained(g) { 4 } else { 1 })
            .sum();
        for (r, &got) in held(world).iter().enumerate() {
            // The caching allocator rounds each of the 4 buffers per group up to 512 bytes.
            let slack = layout.groups.len() * 4 * 512;
            assert!(
                got >= state && got <= state + slack,
                "rank {r} of {world}: {got} bytes allocated, the state's share is {state}"
            );
        }
    }
}

/// The held-out evaluation's forward on N ranks (each rank its own rows, on its shards) gives
/// the logits of the one-process model: the same weights gathered, the same kernels, so the
/// same f32 values bit for bit, with an image and without; a rank with no rows only takes
/// part in the gathers (the vision groups too, when another rank's rows have images).
#[test]
fn held_out_logits_on_any_number_of_ranks_are_the_one_process_model_s() {
    let cfg = config();
    let host = init(&cfg, 9);
    let mut rng = cannon_trainer::train::data::shuffle::SplitMix64::new(3);
    let batches = [
        micro_batch(&mut rng, true, false),
        micro_batch(&mut rng, false, true),
    ];
    let one = model(&cfg, &host);
    for b in &batches {
        let acts = one.forward::<f32>(b).unwrap();
        let want: Vec<u32> = acts
            .logits()
            .unwrap()
            .to_host(one.exec.stream())
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect();
        for world in [1, 2, 4] {
            // Every rank the batch; then only the last rank.
            for alone in [false, true] {
                let s = settings(&[Part::Vision]);
                let got = run_cpu_ranks(world, Duration::from_secs(60), |comm, exec| {
                    let mine = (!alone || comm.rank() == world - 1).then_some(b);
                    let source = ShardSource::Full(&host);
                    let mut rank = FsdpRank::new(comm, exec, cfg.clone(), source, s.clone())?;
                    rank.forward_logits::<f32, _>(mine, |t, st| t.to_host(st))
                })
                .unwrap();
                for (r, g) in got.iter().enumerate() {
                    let has = !alone || r == world - 1;
                    let images = b.images.len();
                    let Some(g) = g else {
                        assert!(!has, "{world} ranks, rank {r}: no logits");
                        continue;
                    };
                    assert!(has, "{world} ranks, rank {r}: logits of no rows");
                    let g: Vec<u32> = g.iter().map(|x| x.to_bits()).collect();
                    assert_eq!(g, want, "{world} ranks, rank {r}, images: {images}");
                }
            }
        }
    }
}
