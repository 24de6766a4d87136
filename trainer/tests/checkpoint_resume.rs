//! Resume continues bit for bit: K steps of a tiny Mistral3 on the synthetic shapes set (data
//! loader, forward, backward, clipping, AdamW on a warmup + cosine schedule) against k steps,
//! a checkpoint, a fresh process state rebuilt from it alone, and K - k more steps. Losses,
//! weights, moments and progress must be identical to the bit.

mod common;

use cannon_runtime::rng::SplitMix64;
use cannon_trainer::model::optim::{clip_grad_norm, AdamW, AdamWConfig};
use cannon_trainer::model::{
    DeviceCtx, LossMode, Mistral3, Mistral3Config, ParamLayout, Params, Part,
};
use cannon_trainer::train::checkpoint::{
    hf_config_json, Checkpoint, CheckpointDir, DataState, Progress, Snapshot,
};
use cannon_trainer::train::data::shuffle::Position;
use cannon_trainer::train::data::{synth, DataConfig, Loader, Tekken};
use serde_json::json;
use std::path::PathBuf;
use std::sync::OnceLock;

const VOCAB: u32 = 2048;
const STEPS: u64 = 6;
const SAVE_AT: u64 = 3;
const TRAINABLE: [Part; 2] = [Part::Projector, Part::Text];

fn tok() -> &'static Tekken {
    static T: OnceLock<Tekken> = OnceLock::new();
    T.get_or_init(|| {
        let path = common::shared_path("tokenizers/tekken_240911.json");
        Tekken::from_file(path, Some(VOCAB)).unwrap()
    })
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cannon-resume-{}-{name}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    d
}

fn data_config() -> &'static DataConfig {
    static C: OnceLock<DataConfig> = OnceLock::new();
    C.get_or_init(|| DataConfig {
        dataset: Some(synth::write(&scratch("data"), 16, 5).unwrap().train),
        max_len: 160,
        batch_size: 2,
        seed: 9,
        ..DataConfig::default()
    })
}

/// A tiny model whose vocabulary, [IMG] id and patch size are the data pipeline's.
fn model_config() -> Mistral3Config {
    let img = tok().special_id("[IMG]").unwrap();
    Mistral3Config::from_json(&common::tiny_vlm_config_json(img, tok().vocab_size(), 1)).unwrap()
}

/// Step 0 of the run: small random weights (norms 1), zero moments, the loader at its start.
fn fresh_state() -> Snapshot {
    let cfg = model_config();
    let layout = ParamLayout::new(&cfg);
    let mut rng = SplitMix64::new(17);
    let mut host: Vec<Vec<f32>> = layout.groups.iter().map(|g| vec![0.0; g.len]).collect();
    for (g, slot) in layout.slots() {
        let w = &mut host[g][slot.range()];
        if slot.name.contains("norm") || slot.name.contains("ln_pre") {
            w.fill(1.0);
        } else {
            w.iter_mut()
                .for_each(|x| *x = (rng.unit_f64() as f32 - 0.5) * 0.2);
        }
    }
    let exec = DeviceCtx::cpu();
    let params = Params::from_host(&exec, layout, &host).unwrap();
    let model_config = hf_config_json(&cfg);
    let model = Mistral3 {
        cfg,
        params,
        loss_mode: LossMode::Full,
        memory: Default::default(),
        exec,
    };
    let grads = model.grads(&TRAINABLE).unwrap();
    let adamw = AdamWConfig {
        lr: 2e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let opt = AdamW::new(&model.exec, adamw, &grads).unwrap();
    Snapshot {
        model,
        model_config,
        opt,
        progress: Progress {
            step: 0,
            config: json!({"train": {"steps": STEPS, "lr": adamw.lr}}),
            scheduler: json!({"kind": "cosine", "warmup": 2, "total": STEPS}),
            data: DataState::default(),
            rng: SplitMix64::new(23).state(),
        },
    }
}

/// Linear warmup over 2 steps, then cosine down to a tenth: the learning rate of step `s`
/// (1-based) is a function of the restored step alone.
fn lr_at(base: f64, s: u64) -> f64 {
    let warmup = 2;
    if s <= warmup {
        return base * s as f64 / warmup as f64;
    }
    let t = (s - warmup) as f64 / (STEPS - warmup) as f64;
    let min = base * 0.1;
    min + 0.5 * (base - min) * (1.0 + (std::f64::consts::PI * t).cos())
}

/// Runs steps until `progress.step == until`, the way a training loop does: the next batch,
/// forward, backward, clip to 1.0, AdamW at the scheduled rate; the RNG draws once per step.
/// Returns each step's loss.
fn train(state: &mut Snapshot, loader: &mut Loader, until: u64) -> Vec<f64> {
    let mut grads = state.model.grads(&TRAINABLE).unwrap();
    let exec = state.model.exec.clone();
    let st = exec.stream();
    let mut rng = SplitMix64::new(state.progress.rng);
    let mut losses = Vec::new();
    while state.progress.step < until {
        let batch = loader.next_batch().unwrap();
        let acts = state.model.forward::<f32>(&batch).unwrap();
        grads.zero(st).unwrap();
        state
            .model
            .backward(&batch, &acts, &mut grads, None)
            .unwrap();
        losses.push(acts.loss());
        drop(acts);
        clip_grad_norm(st, &mut grads, 1.0).unwrap();
        let step = state.progress.step + 1;
        let lr = lr_at(state.opt.cfg.lr, step);
        state
            .opt
            .update(st, &mut state.model.params, &grads, lr)
            .unwrap();
        rng.next_u64();
        let p = &mut state.progress;
        p.step = step;
        p.rng = rng.state();
        p.data.position = loader.position();
        p.data.consumed_samples += data_config().batch_size as u64;
        p.scheduler["step"] = json!(step);
        p.scheduler["lr"] = json!(lr);
    }
    losses
}

fn loader_at(pos: Position) -> Loader {
    Loader::open(data_config(), tok(), pos).unwrap()
}

fn bits(state: &Snapshot) -> Vec<Vec<u32>> {
    let st = state.model.exec.stream();
    let host = |t: &cannon_trainer::model::offload::Stored| -> Vec<u32> {
        t.to_host(st).unwrap().iter().map(|x| x.to_bits()).collect()
    };
    let mut out: Vec<Vec<u32>> = state.model.params.data.iter().map(host).collect();
    for m in state.opt.m.iter().chain(&state.opt.v).flatten() {
        out.push(host(m));
    }
    out
}

#[test]
fn saved_at_step_k_and_resumed_gives_the_uninterrupted_run_bit_for_bit() {
    // The uninterrupted run.
    let mut straight = fresh_state();
    let mut loader = loader_at(Position::default());
    let losses = train(&mut straight, &mut loader, STEPS);
    assert_eq!(losses.len(), STEPS as usize);
    assert!(losses.iter().all(|l| l.is_finite()));
    assert!(
        losses.windows(2).any(|w| w[0] != w[1]),
        "the steps train: {losses:?}"
    );

    // The same run stopped after SAVE_AT steps...
    let root = scratch("ckpt");
    let dir = CheckpointDir::new(&root);
    let mut first = fresh_state();
    let mut loader = loader_at(Position::default());
    let mut resumed_losses = train(&mut first, &mut loader, SAVE_AT);
    first.save(&dir, 2).unwrap();
    drop((first, loader));

    // ... and continued from nothing but the checkpoint, on a new allocator.
    let mut ckpt = Checkpoint::open(&root).unwrap();
    assert_eq!(ckpt.step(), SAVE_AT);
    let mut state = Snapshot::load(&mut ckpt, DeviceCtx::cpu()).unwrap();
    let mut loader = loader_at(state.progress.data.position);
    resumed_losses.extend(train(&mut state, &mut loader, STEPS));

    let as_bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        as_bits(&resumed_losses),
        as_bits(&losses),
        "losses: resumed {resumed_losses:?}, straight {losses:?}"
    );
    assert_eq!(bits(&state), bits(&straight), "weights and moments");
    assert_eq!(state.opt.step, straight.opt.step);
    assert_eq!(state.progress, straight.progress);
}
