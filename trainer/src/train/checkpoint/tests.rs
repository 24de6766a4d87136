//! Save/restore round trips, crashes injected half-way through a save, pruning, resharding
//! and the errors a checkpoint that does not fit gives. (The end-to-end resume, the killed
//! save and the export are integration tests: `tests/checkpoint_*.rs`.)

use super::dir::{Fault, SaveStep};
use super::manifest::group_entries;
use super::*;
use crate::model::config::tiny_config;
use crate::model::offload::Stored;
use crate::model::optim::{AdamW, AdamWConfig};
use crate::model::{DeviceCtx, LossMode, Mistral3, Mistral3Config, ParamLayout, Params, Part};
use cannon_kernels::Tensor;
use cannon_runtime::comm::CpuWorld;
use cannon_runtime::rng::SplitMix64;
use cannon_runtime::Stream;
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;

fn random_vec(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.unit_f64() as f32 - 0.5).collect()
}

/// A state with random weights and random moments for the text part (vision and projector
/// frozen), as if `step` steps had run.
fn random_state(seed: u64, step: u64) -> Snapshot {
    let cfg = tiny_config();
    let layout = ParamLayout::new(&cfg);
    let exec = DeviceCtx::cpu();
    let mut rng = SplitMix64::new(seed);
    let host: Vec<Vec<f32>> = layout
        .groups
        .iter()
        .map(|g| random_vec(&mut rng, g.len))
        .collect();
    let params = Params::from_host(&exec, layout.clone(), &host).unwrap();
    let moment = |rng: &mut SplitMix64| -> Vec<Option<Tensor<f32>>> {
        layout
            .groups
            .iter()
            .map(|g| {
                (g.part == Part::Text)
                    .then(|| exec.upload(&random_vec(rng, g.len), &[g.len]).unwrap())
            })
            .collect()
    };
    let (m, v) = (moment(&mut rng), moment(&mut rng));
    Snapshot {
        model_config: hf_config_json(&cfg),
        model: Mistral3 {
            cfg,
            params,
            loss_mode: LossMode::Full,
            memory: Default::default(),
            exec,
        },
        opt: AdamW::from_moments(
            AdamWConfig {
                lr: 3e-4,
                ..AdamWConfig::default()
            },
            step,
            m,
            v,
        ),
        progress: Progress {
            step,
            config: json!({"train": {"lr": 3e-4}}),
            scheduler: json!({"kind": "cosine", "step": step}),
            data: DataState {
                position: crate::train::data::Position {
                    epoch: 1,
                    index: 3 + step as usize,
                },
                consumed_samples: 17 * step,
                consumed_tokens: 900 * step,
                dropped_samples: 2,
            },
            rng: rng.state(),
        },
    }
}

fn tmp_root(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cannon-ckpt-unit-{}-{name}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    d
}

fn bits(t: &Stored, st: &Stream) -> Vec<u32> {
    t.to_host(st).unwrap().iter().map(|x| x.to_bits()).collect()
}

/// Every tensor and every progress field of two states, bit for bit.
fn assert_same(a: &Snapshot, b: &Snapshot) {
    let st = a.model.exec.stream();
    assert_eq!(a.model.params.data.len(), b.model.params.data.len());
    for (x, y) in a.model.params.data.iter().zip(&b.model.params.data) {
        assert_eq!(bits(x, st), bits(y, st));
    }
    for (xs, ys) in [(&a.opt.m, &b.opt.m), (&a.opt.v, &b.opt.v)] {
        for (x, y) in xs.iter().zip(ys) {
            match (x, y) {
                (Some(x), Some(y)) => assert_eq!(bits(x, st), bits(y, st)),
                (None, None) => {}
                _ => panic!("trained groups differ"),
            }
        }
    }
    assert_eq!(a.opt.step, b.opt.step);
    assert_eq!(a.opt.cfg, b.opt.cfg);
    assert_eq!(a.progress, b.progress);
    assert_eq!(a.model_config, b.model_config);
}

#[test]
fn one_rank_state_round_trips_bit_for_bit() {
    let root = tmp_root("roundtrip");
    let dir = CheckpointDir::new(&root);
    let state = random_state(1, 7);
    let path = state.save(&dir, 0).unwrap();
    assert_eq!(path, root.join("step-000007"));
    let mut ckpt = Checkpoint::open(&root).unwrap();
    assert_eq!(ckpt.step(), 7);
    let m = ckpt.manifest();
    assert_eq!((m.world_size, m.files.len(), m.groups.len()), (1, 1, 8));
    assert_eq!(m.groups[0].name, "vision.embed");
    assert_eq!(m.groups[3].name, "projector");
    assert_eq!(m.groups[5].name, "text.layers.0");
    assert_eq!(m.groups[7].name, "text.head");
    assert!(!m.groups[3].trained && m.groups[7].trained);
    let back = Snapshot::load(&mut ckpt, DeviceCtx::cpu()).unwrap();
    assert_same(&state, &back);

    // Restoring into a live state of the same shape overwrites everything.
    let mut other = random_state(2, 1);
    other.restore(&mut ckpt).unwrap();
    assert_same(&state, &other);
}

#[test]
fn a_save_stopped_half_way_leaves_the_previous_checkpoint_the_latest() {
    let root = tmp_root("crash");
    let dir = CheckpointDir::new(&root);
    let first = random_state(3, 1);
    first.save(&dir, 0).unwrap();
    let second = random_state(4, 2);
    let meta = second.save_meta().unwrap();
    let shards = RankShards::stored(
        0,
        &second.model.params.data,
        &second.opt.m,
        &second.opt.v,
        0,
    )
    .unwrap();
    let st = second.model.exec.stream();

    // A crash in the middle of the rank file.
    let crashing = dir
        .clone()
        .with_fault(SaveStep::RankTensor(5), Fault::Crash);
    let pending = crashing.begin(2, 1).unwrap();
    let err = pending.write_rank(&meta, &shards, st).unwrap_err();
    assert!(matches!(err, CheckpointError::Injected(_)), "{err}");
    assert!(dir.tmp_path(2).is_dir());
    assert_eq!(dir.latest().unwrap().unwrap().0, 1);
    let mut ckpt = Checkpoint::open(&root).unwrap();
    assert_eq!(ckpt.step(), 1);
    assert_same(
        &first,
        &Snapshot::load(&mut ckpt, DeviceCtx::cpu()).unwrap(),
    );

    // A crash after every file is written but before the manifest.
    let crashing = dir.clone().with_fault(SaveStep::FilesWritten, Fault::Crash);
    let pending = crashing.begin(2, 1).unwrap();
    pending.write_rank(&meta, &shards, st).unwrap();
    assert!(pending.commit(&meta).is_err());
    assert_eq!(dir.latest().unwrap().unwrap().0, 1);
    assert_eq!(Checkpoint::open(&root).unwrap().step(), 1);

    // The next save succeeds over the leftovers and cleans them up.
    second.save(&dir, 0).unwrap();
    assert!(!dir.tmp_path(2).exists());
    assert!(dir.unfinished().unwrap().is_empty());
    let mut ckpt = Checkpoint::open(&root).unwrap();
    assert_eq!(ckpt.step(), 2);
    assert_same(
        &second,
        &Snapshot::load(&mut ckpt, DeviceCtx::cpu()).unwrap(),
    );
}

/// A NaN in a moment, or a weight past the run's bound, stops the save before anything is
/// committed: the previous checkpoint stays the latest. (NaN in the padding of a shard is
/// not looked at: the resharding tests put it there.)
#[test]
fn a_non_finite_or_diverged_tensor_is_never_committed() {
    let root = tmp_root("unsafe");
    let dir = CheckpointDir::new(&root);
    random_state(3, 1).save(&dir, 0).unwrap();
    let mut bad = random_state(4, 2);
    let exec = bad.model.exec.clone();
    let st = exec.stream();
    let g = bad.opt.v.iter().position(Option::is_some).unwrap();
    let mut host = bad.opt.v[g].as_ref().unwrap().to_host(st).unwrap();
    host[7] = f32::NAN;
    let n = host.len();
    bad.opt.v[g] = Some(Stored::Device(exec.upload(&host, &[n]).unwrap()));
    let err = bad.save(&dir, 0).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, CheckpointError::Unsafe { .. }), "{err:?}");
    assert!(
        msg.contains("exp_avg_sq/") && msg.contains("NaN at element 7"),
        "{msg}"
    );
    assert_eq!(dir.latest().unwrap().unwrap().0, 1);

    // Finite, but past the bound the run sets (the random weights reach about 0.5).
    let fine = random_state(5, 2);
    let mut meta = fine.save_meta().unwrap();
    meta.max_abs_weight = 0.25;
    let shards =
        RankShards::stored(0, &fine.model.params.data, &fine.opt.m, &fine.opt.v, 0).unwrap();
    let err = save_local(&dir, &meta, &[shards], st, 0).unwrap_err();
    assert!(
        err.to_string()
            .contains("past train.max_abs_weight = 2.5e-1"),
        "{err}"
    );
    assert_eq!(dir.latest().unwrap().unwrap().0, 1);
    assert_eq!(Checkpoint::open(&root).unwrap().step(), 1);
    // The bound is on weights only: the same state under no bound is saved.
    meta.max_abs_weight = f64::INFINITY;
    let shards =
        RankShards::stored(0, &fine.model.params.data, &fine.opt.m, &fine.opt.v, 0).unwrap();
    save_local(&dir, &meta, &[shards], st, 0).unwrap();
    assert_eq!(dir.latest().unwrap().unwrap().0, 2);
}

#[test]
fn keep_last_prunes_older_checkpoints_and_a_step_saved_twice_is_replaced() {
    let root = tmp_root("prune");
    let dir = CheckpointDir::new(&root);
    for step in 1..=5 {
        random_state(step, step).save(&dir, 2).unwrap();
    }
    let steps: Vec<u64> = dir.complete().unwrap().iter().map(|c| c.0).collect();
    assert_eq!(steps, vec![4, 5]);
    let again = random_state(99, 5);
    again.save(&dir, 2).unwrap();
    let mut ckpt = Checkpoint::open(&dir.path(5)).unwrap();
    assert_same(
        &again,
        &Snapshot::load(&mut ckpt, DeviceCtx::cpu()).unwrap(),
    );
    assert!(!root.join("step-000005.old").exists());
}

/// Shards of every group over `world` ranks, cut from the state's whole groups.
struct Sharded {
    params: Vec<Vec<Tensor<f32>>>,
    m: Vec<Vec<Option<Tensor<f32>>>>,
    v: Vec<Vec<Option<Tensor<f32>>>>,
    ranges: Vec<Vec<ShardRange>>,
}

fn shard(state: &Snapshot, world: usize) -> Sharded {
    let st = state.model.exec.stream();
    let layout = &state.model.params.layout;
    let ranges: Vec<Vec<ShardRange>> = layout
        .groups
        .iter()
        .map(|g| padded_shards(g.len, world))
        .collect();
    let cut = |t: &Stored, s: ShardRange| {
        let mut v = t.to_host(st).unwrap()[s.range()].to_vec();
        // Padding holds garbage on purpose: it must never be read back.
        v.resize(s.stored, f32::NAN);
        Tensor::from_host(st, &v, &[s.stored]).unwrap()
    };
    let (mut params, mut m, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..world {
        params.push(
            state
                .model
                .params
                .data
                .iter()
                .zip(&ranges)
                .map(|(t, s)| cut(t, s[r]))
                .collect(),
        );
        let opt = |xs: &Vec<Option<Stored>>| -> Vec<Option<Tensor<f32>>> {
            xs.iter()
                .zip(&ranges)
                .map(|(t, s)| t.as_ref().map(|t| cut(t, s[r])))
                .collect()
        };
        m.push(opt(&state.opt.m));
        v.push(opt(&state.opt.v));
    }
    Sharded {
        params,
        m,
        v,
        ranges,
    }
}

fn sharded_meta(state: &Snapshot, sh: &Sharded, world: usize) -> SaveMeta {
    let trained: Vec<bool> = state.opt.m.iter().map(Option::is_some).collect();
    SaveMeta {
        world_size: world,
        groups: group_entries(&state.model.params.layout, &sh.ranges, &trained).unwrap(),
        ..state.save_meta().unwrap()
    }
}

/// Saved over 3 ranks (uneven groups, padded), read back in 1, 2 and 4 ranks' layouts: every
/// shard holds exactly the elements of its range and zero padding.
#[test]
fn a_checkpoint_of_three_ranks_reshards_to_any_world_size() {
    // Saved at these world sizes (3 leaves padding on its last shard; 5 cuts groups smaller
    // than the world), read back at every world size from 1 to 7.
    for saved in [1usize, 2, 3, 5] {
        let root = tmp_root(&format!("reshard-{saved}"));
        let dir = CheckpointDir::new(&root);
        let state = random_state(5, 3);
        let sh = shard(&state, saved);
        let meta = sharded_meta(&state, &sh, saved);
        let ranks: Vec<RankShards<'_>> = (0..saved)
            .map(|r| {
                RankShards::device(r, &sh.params[r], &sh.m[r], &sh.v[r], 100 + r as u64).unwrap()
            })
            .collect();
        let st = state.model.exec.stream();
        save_local(&dir, &meta, &ranks, st, 0).unwrap();
        let mut ckpt = Checkpoint::open(&root).unwrap();
        assert_eq!(
            ckpt.manifest().rng,
            (0..saved as u64).map(|r| 100 + r).collect::<Vec<_>>()
        );
        assert_eq!(ckpt.rng(saved), None);
        if saved == 3 {
            assert!(ckpt
                .manifest()
                .groups
                .iter()
                .any(|g| g.shards[2].padding() > 0));
        }

        let whole = |t: &Stored| t.to_host(st).unwrap();
        for world in 1..=7 {
            for (g, gl) in state.model.params.layout.groups.iter().enumerate() {
                for target in padded_shards(gl.len, world) {
                    let mut want = whole(&state.model.params.data[g])[target.range()].to_vec();
                    want.resize(target.stored, 0.0);
                    assert_eq!(ckpt.read_shard(Kind::Param, g, target).unwrap(), want);
                    if let Some(m) = &state.opt.m[g] {
                        let mut want = whole(m)[target.range()].to_vec();
                        want.resize(target.stored, 0.0);
                        assert_eq!(ckpt.read_shard(Kind::ExpAvg, g, target).unwrap(), want);
                    } else {
                        let err = ckpt.read_shard(Kind::ExpAvg, g, target).unwrap_err();
                        assert!(err.to_string().contains("frozen"), "{err}");
                    }
                }
            }
        }
        // Consolidated on one rank it is the state it was cut from.
        let mut back = Snapshot::load(&mut ckpt, DeviceCtx::cpu()).unwrap();
        back.progress.rng = state.progress.rng;
        assert_same(&state, &back);
        std::fs::remove_dir_all(&root).ok();
    }
}

/// Ranks as threads on the in-process communicator, each saving its own (host) shards.
#[test]
fn ranks_save_their_shards_together_over_the_communicator() {
    let root = tmp_root("distributed");
    let dir = CheckpointDir::new(&root);
    let state = random_state(6, 4);
    let world = 2;
    let sh = shard(&state, world);
    let meta = sharded_meta(&state, &sh, world);
    // Tensors are not Send; every rank's shard is rebuilt from host copies on its thread.
    let st = state.model.exec.stream();
    let host = |ts: &Vec<Option<Tensor<f32>>>| -> Vec<Option<Vec<f32>>> {
        ts.iter()
            .map(|t| t.as_ref().map(|t| t.to_host(st).unwrap()))
            .collect()
    };
    let per_rank: Vec<_> = (0..world)
        .map(|r| {
            let p: Vec<Vec<f32>> = sh.params[r]
                .iter()
                .map(|t| t.to_host(st).unwrap())
                .collect();
            (p, host(&sh.m[r]), host(&sh.v[r]))
        })
        .collect();
    let comms = CpuWorld::new(world, Duration::from_secs(30)).unwrap();
    let handles: Vec<_> = comms
        .into_iter()
        .zip(per_rank)
        .map(|(comm, (p, m, v))| {
            let (dir, meta) = (dir.clone(), meta.clone());
            std::thread::spawn(move || {
                let st = Stream::cpu();
                // Host shards (what an FSDP rank's state copy holds).
                fn host(x: &Option<Vec<f32>>) -> Option<ShardData<'_>> {
                    x.as_deref().map(ShardData::Host)
                }
                let groups = (0..p.len())
                    .map(|g| GroupShards {
                        param: ShardData::Host(&p[g]),
                        exp_avg: host(&m[g]),
                        exp_avg_sq: host(&v[g]),
                    })
                    .collect();
                let mine = RankShards {
                    rank: comm.rank(),
                    groups,
                    rng: 7 * comm.rank() as u64,
                };
                save_distributed(&dir, &meta, &mine, &comm, &st, 1).map_err(|e| e.to_string())
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap().unwrap(), root.join("step-000004"));
    }
    let mut ckpt = Checkpoint::open(&root).unwrap();
    assert_eq!(ckpt.manifest().world_size, 2);
    assert_eq!(ckpt.manifest().rng, vec![0, 7]);
    let mut back = Snapshot::load(&mut ckpt, DeviceCtx::cpu()).unwrap();
    back.progress.rng = state.progress.rng;
    assert_same(&state, &back);
}

#[test]
fn a_checkpoint_that_does_not_fit_is_an_error_naming_what() {
    let root = tmp_root("mismatch");
    let dir = CheckpointDir::new(&root);
    let state = random_state(8, 2);
    let path = state.save(&dir, 0).unwrap();

    // The freeze list changed: the projector trains now.
    let mut live = random_state(9, 0);
    let g = live.model.params.layout.projector();
    let len = live.model.params.layout.groups[g].len;
    live.opt.m[g] = Some(Stored::Device(live.model.exec.zeros(&[len]).unwrap()));
    live.opt.v[g] = Some(Stored::Device(live.model.exec.zeros(&[len]).unwrap()));
    let err = live
        .restore(&mut Checkpoint::open(&path).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("group projector") && err.contains("freeze"),
        "{err}"
    );

    // Another model size.
    let mut cfg_json = hf_config_json(&tiny_config());
    cfg_json["text_config"]["intermediate_size"] = json!(48);
    let cfg = Mistral3Config::from_json(&cfg_json.to_string()).unwrap();
    let err = Checkpoint::open(&path)
        .unwrap()
        .manifest()
        .check_layout(&ParamLayout::new(&cfg))
        .unwrap_err()
        .to_string();
    assert!(err.contains("text.layers.0"), "{err}");

    // A newer format version.
    let manifest = path.join("manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text.replace("\"version\": 1", "\"version\": 9")).unwrap();
    let err = Checkpoint::open(&path).unwrap_err().to_string();
    assert!(err.contains("version 9"), "{err}");
    std::fs::write(&manifest, &text).unwrap();

    // A truncated rank file.
    let file = path.join("rank-00000-of-00001.safetensors");
    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(len - 4)
        .unwrap();
    let err = Checkpoint::open(&path).unwrap_err().to_string();
    assert!(
        err.contains("rank-00000-of-00001") && err.contains("truncated"),
        "{err}"
    );

    // A folder with no complete checkpoint.
    let empty = tmp_root("empty");
    std::fs::create_dir_all(empty.join("step-000003.tmp")).unwrap();
    let err = Checkpoint::open(&empty).unwrap_err();
    assert!(matches!(err, CheckpointError::NoCheckpoint(_)), "{err}");
}

mod crash;
