//! A tiny Mistral3 with random weights and a global batch of micro batches, some with images
//! and some without, and the unsharded reference step the sharded ranks must reproduce.

#![allow(dead_code)]

use cannon_kernels::cross_entropy::{LossNorm, IGNORE_INDEX};
use cannon_runtime::rng::SplitMix64;
use cannon_trainer::model::batch::{Batch, Images};
use cannon_trainer::model::optim::{clip_grad_norm, AdamW, AdamWConfig};
use cannon_trainer::model::{
    ActElem, DeviceCtx, Grads, LossMode, Mistral3, Mistral3Config, ModelPass, ParamLayout, Params,
    Part,
};
use cannon_trainer::parallel::fsdp::{
    run_cpu_ranks, FsdpRank, FsdpSettings, ShardState, StepStats,
};
use std::time::Duration;

pub const IMG: u32 = 10;
/// Tokens per micro batch row.
pub const SEQ: usize = 24;

/// Text D 32 (4 q heads, 2 kv heads of 8), 2 layers, vocab 64; vision D 16, 2 layers, patch 2,
/// 2x2 merge: an 8x8 image is 16 patches and 4 `[IMG]` tokens.
pub fn config() -> Mistral3Config {
    Mistral3Config::from_json(&format!(
        r#"{{
        "model_type": "mistral3", "image_token_index": {IMG}, "spatial_merge_size": 2,
        "projector_hidden_act": "gelu", "multimodal_projector_bias": false,
        "vision_feature_layer": -1,
        "text_config": {{
            "model_type": "mistral", "vocab_size": 64, "hidden_size": 32,
            "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 128,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": null
        }},
        "vision_config": {{
            "model_type": "pixtral", "hidden_size": 16, "intermediate_size": 24,
            "num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 8,
            "num_channels": 3, "patch_size": 2, "image_size": 16, "rope_theta": 10000.0,
            "hidden_act": "silu"
        }}
    }}"#
    ))
    .unwrap()
}

/// Random host groups: weights uniform in +-0.15, norm weights 1.
pub fn init(cfg: &Mistral3Config, seed: u64) -> Vec<Vec<f32>> {
    let layout = ParamLayout::new(cfg);
    let mut host: Vec<Vec<f32>> = layout.groups.iter().map(|g| vec![0.0; g.len]).collect();
    let mut rng = SplitMix64::new(seed);
    for (g, slot) in layout.slots() {
        let w = &mut host[g][slot.range()];
        if slot.name.contains("norm") || slot.name.contains("ln_pre") {
            w.fill(1.0);
        } else {
            w.iter_mut()
                .for_each(|x| *x = (rng.unit_f64() as f32 - 0.5) * 0.3);
        }
    }
    host
}

/// One row of `SEQ` tokens; with `image`, one 8x8 image whose 4 `[IMG]` tokens follow a
/// BOS. The prompt (and the image) is not trained; the answer is a short token pattern the
/// model can learn. Two packed sequences when `packed`.
pub fn micro_batch(rng: &mut SplitMix64, image: bool, packed: bool) -> Batch {
    let mut ids = Vec::with_capacity(SEQ);
    let mut labels = Vec::with_capacity(SEQ);
    let mut images = Images::new(3);
    ids.push(1);
    labels.push(IGNORE_INDEX);
    if image {
        let px: Vec<f32> = (0..3 * 8 * 8)
            .map(|_| rng.unit_f64() as f32 * 2.0 - 1.0)
            .collect();
        images.push(8, 8, &px).unwrap();
        for _ in 0..4 {
            ids.push(IMG);
            labels.push(IGNORE_INDEX);
        }
    }
    let prompt = 3 + rng.below(4) as usize;
    for _ in 0..prompt {
        ids.push(11 + rng.below(20) as u32);
        labels.push(IGNORE_INDEX);
    }
    let start = 31 + rng.below(8) as u32;
    while ids.len() < SEQ {
        let t = start + (ids.len() as u32 % 5) * 5;
        ids.push(t % 64);
        labels.push((t % 64) as i32);
    }
    let mut b = Batch {
        rows: 1,
        seq: SEQ,
        input_ids: ids,
        labels,
        images,
        ..Batch::default()
    };
    if packed {
        // Two sequences: positions restart at SEQ / 2 + 1 (after the image tokens).
        let cut = SEQ / 2 + 1;
        b.position_ids = (0..cut as u32).chain(0..(SEQ - cut) as u32).collect();
    }
    b
}

/// `n` micro batches: images in most, none in every third, the last one packed.
pub fn global_batch(n: usize, seed: u64) -> Vec<Batch> {
    let mut rng = SplitMix64::new(seed);
    (0..n)
        .map(|i| micro_batch(&mut rng, i % 3 != 1, i + 1 == n))
        .collect()
}

pub fn settings(frozen: &[Part]) -> FsdpSettings {
    FsdpSettings {
        adamw: AdamWConfig {
            lr: 3e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.01,
        },
        max_grad_norm: 1.0,
        frozen: frozen.to_vec(),
        loss_mode: LossMode::Full,
        memory: Default::default(),
    }
}

/// What a run leaves: per-step stats (rank 0's), the final full parameters, and every rank's
/// shard state.
pub struct Run {
    pub stats: Vec<StepStats>,
    pub params: Vec<Vec<f32>>,
    pub states: Vec<ShardState>,
    /// Per rank: bytes allocated before the first step (shards, gradients, moments).
    pub resident: Vec<usize>,
    /// Per rank: the largest `max_allocated` over the steps.
    pub peak: Vec<usize>,
    /// Per rank: collectives of the last step made only for the peers.
    pub for_peers: Vec<usize>,
}

/// `steps` sharded steps on `world` CPU ranks: micro batch i of `batches` goes to rank
/// `i % world`.
pub fn run_sharded<A: ActElem>(
    world: usize,
    cfg: &Mistral3Config,
    host: &[Vec<f32>],
    batches: &[Batch],
    s: &FsdpSettings,
    steps: usize,
) -> Run {
    let per_rank = run_cpu_ranks(world, Duration::from_secs(20), |comm, exec| {
        let r = comm.rank();
        let mut rank = FsdpRank::new(
            comm,
            exec,
            cfg.clone(),
            cannon_trainer::parallel::fsdp::ShardSource::Full(host),
            s.clone(),
        )?;
        let resident = rank.exec().memory().allocated;
        let mine: Vec<Batch> = batches.iter().skip(r).step_by(world).cloned().collect();
        let mut stats = Vec::new();
        for _ in 0..steps {
            stats.push(rank.step::<A>(&mine, s.adamw.lr)?);
        }
        let full = rank.gather_full_params()?;
        let params = full.to_host(rank.exec().stream())?;
        Ok((stats, params, rank.state()?, resident))
    })
    .unwrap();
    let peak = per_rank
        .iter()
        .map(|(st, ..)| st.iter().map(|s| s.memory.max_allocated).max().unwrap_or(0))
        .collect();
    let resident = per_rank.iter().map(|r| r.3).collect();
    let for_peers = per_rank
        .iter()
        .map(|(st, ..)| st.last().map_or(0, |s| s.for_peers))
        .collect();
    let states = per_rank.iter().map(|r| r.2.clone()).collect();
    let (stats, params, ..) = per_rank.into_iter().next().unwrap();
    Run {
        stats,
        params,
        states,
        resident,
        peak,
        for_peers,
    }
}

/// The unsharded reference: the model holds every group; per step, every micro batch's
/// gradient is accumulated into one set of gradients with the loss divided by the step's
/// target count, then global-norm clipping and AdamW, written out here with the model's own
/// pass, gradients and optimizer (independent of `FsdpRank`). Returns the per-step losses,
/// the per-step gradient norms before clipping, and the final parameters.
pub fn run_unsharded(
    cfg: &Mistral3Config,
    host: &[Vec<f32>],
    batches: &[Batch],
    s: &FsdpSettings,
    steps: usize,
) -> (Vec<f64>, Vec<f64>, Vec<Vec<f32>>) {
    let exec = DeviceCtx::cpu();
    let layout = ParamLayout::new(cfg);
    let mut params = Params::from_host(&exec, layout.clone(), host).unwrap();
    let trainable: Vec<Part> = [Part::Vision, Part::Projector, Part::Text]
        .into_iter()
        .filter(|p| !s.frozen.contains(p))
        .collect();
    let mut grads = Grads::new(&exec, &layout, &trainable).unwrap();
    let mut opt = AdamW::new(&exec, s.adamw, &grads).unwrap();
    let count: usize = batches
        .iter()
        .map(|b| b.targets().iter().filter(|&&t| t != IGNORE_INDEX).count())
        .sum();
    let st = exec.stream();
    let (mut losses, mut norms) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        grads.zero(st).unwrap();
        let mut sum = 0.0;
        for b in batches {
            let pass = ModelPass {
                cfg,
                exec: &exec,
                loss_mode: s.loss_mode,
                memory: s.memory,
                params: &params,
                loss_norm: LossNorm::Divisor(count as f64),
                logits: cannon_trainer::model::Logits::Grad,
                cp: None,
            };
            let acts = pass.forward::<f32>(b).unwrap();
            pass.backward(b, &acts, &mut grads, None).unwrap();
            sum += acts.head.sum;
        }
        losses.push(sum / count as f64);
        norms.push(clip_grad_norm(st, &mut grads, s.max_grad_norm).unwrap());
        opt.update(st, &mut params, &grads, s.adamw.lr).unwrap();
    }
    (losses, norms, params.to_host(st).unwrap())
}

/// `sum |a - b| / sum |b|`: the seed's normalised mean absolute loss difference.
pub fn loss_diff(a: &[f64], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum();
    num / b.iter().map(|y| y.abs()).sum::<f64>()
}

/// Relative L2 distance over every group: `||a - b|| / ||b||`.
pub fn rel_l2(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    let (mut d, mut n) = (0.0f64, 0.0f64);
    for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
        d += (*x as f64 - *y as f64).powi(2);
        n += (*y as f64).powi(2);
    }
    (d / n.max(1e-30)).sqrt()
}

/// The model of `host` (for the plain `Mistral3` path).
pub fn model(cfg: &Mistral3Config, host: &[Vec<f32>]) -> Mistral3 {
    let exec = DeviceCtx::cpu();
    let params = Params::from_host(&exec, ParamLayout::new(cfg), host).unwrap();
    Mistral3 {
        cfg: cfg.clone(),
        params,
        loss_mode: LossMode::Full,
        memory: Default::default(),
        exec,
    }
}
