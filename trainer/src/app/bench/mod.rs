//! `cannon bench step`: full training steps (forward, backward, global-norm clip, AdamW) of an
//! HF config with random weights, on the batch layout of `shared/bench/torch_train_step.py`
//! (B rows of S tokens, one PX x PX image per row, vision tower and projector frozen), timed
//! the way that script times PyTorch, so the two can be run side by side and compared as
//! ratios.
//!
//! ```text
//! row  = BOS, the image's [IMG] x side + [IMG_BREAK] per patch row ([IMG_END] last), random
//!        text tokens in 16..V up to S;  labels = the tokens, IGNORE on BOS and the image block
//! step = zero grads; forward; backward; clip_grad_norm(1.0); AdamW(lr 1e-4, betas (0.9,
//!        0.95), eps 1e-8, weight decay 0.1)      (the script's optimizer)
//! ```
//!
//! The step is the one every run takes (`FsdpRank::step`): on a world of one here, on N
//! in-process ranks with `--nproc N` (`sharded`).

use crate::model::batch::{Batch, Images};
use crate::model::init::{Init, INITIALIZER_RANGE};
use crate::model::optim::AdamWConfig;
use crate::model::{
    ActElem, DeviceCtx, LossMode, Mistral3, Mistral3Config, ModelError, ParamLayout, Part,
};
use crate::parallel::fsdp::{FsdpError, FsdpRank, FsdpSettings, ShardSource};
use crate::train::flops::{step_flops, GemmProbe};
use cannon_kernels::cross_entropy::IGNORE_INDEX;
use cannon_kernels::Precision;
use cannon_runtime::comm::Communicator;
use cannon_runtime::rng::SplitMix64;
use std::time::Instant;

/// The `[IMG_BREAK]` and `[IMG_END]` ids of Tekken (and of the script's batch).
const IMG_BREAK: u32 = 12;
const IMG_END: u32 = 13;

/// What to time.
#[derive(Clone, Debug, PartialEq)]
pub struct StepBench {
    /// Rows B.
    pub batch: usize,
    /// Tokens per row S.
    pub seq: usize,
    /// Image side PX in pixels (one square image per row).
    pub img: usize,
    /// Timed steps.
    pub steps: usize,
    /// Untimed steps first (caches, allocator, thread pool).
    pub warmup: usize,
    pub precision: Precision,
    /// Seed of the random weights, tokens and pixels.
    pub seed: u64,
}

impl Default for StepBench {
    fn default() -> Self {
        // torch_train_step.py's defaults.
        StepBench {
            batch: 2,
            seq: 1024,
            img: 224,
            steps: 6,
            warmup: 2,
            precision: Precision::F32,
            seed: 0,
        }
    }
}

/// What one run measured (the script's JSON fields plus the allocator's).
#[derive(Clone, Debug, PartialEq)]
pub struct StepReport {
    pub precision: Precision,
    pub threads: usize,
    /// Ranks (in-process CPU ranks of a sharded run; 1 unsharded).
    pub nproc: usize,
    pub batch: usize,
    pub seq: usize,
    pub median_step_s: f64,
    pub min_step_s: f64,
    pub tokens_per_s: f64,
    /// The process's peak resident set (VmHWM), MiB; `None` where /proc is not readable.
    pub peak_rss_mib: Option<f64>,
    pub trainable_params: usize,
    /// The last step's loss.
    pub loss: f64,
    /// The allocator's peaks over the timed steps, MiB.
    pub max_allocated_mib: f64,
    pub max_reserved_mib: f64,
    /// Model FLOPs of one step (`crate::train::flops::step_flops`, vision and projector
    /// frozen as in the script).
    pub model_flops: f64,
    /// The best FLOP/s of square GEMMs at the run's precision ([`GEMM_PEAK_N`]) in this run:
    /// before the first step, and (single runs) the probes between steps.
    pub gemm_peak_flops: f64,
    /// Blocks the caching allocator had to take from the host per timed step (0 once every
    /// shape is cached; more means page faults and zeroing inside the step).
    pub device_allocs_per_step: f64,
    /// The median over timed steps of (step time / the step's floor at the GEMM peak measured
    /// beside it): before every step and after the last, the best of two 2048^3 GEMMs (after
    /// a warm-up call) is the machine's peak at that moment, and step i is held against the
    /// mean of the peaks just before and just after it. A machine whose speed drifts within a
    /// run (shared hosts) moves the step and its floor together, which one peak measured at
    /// start-up (the best moment of the run) does not. The sharded run (`--nproc`) cannot probe
    /// between steps without stalling its ranks: there the median step against the mean of
    /// the peaks just before the ranks start and just after they end.
    pub step_over_floor: Option<f64>,
}

pub use crate::train::flops::GEMM_PEAK_N;

impl StepReport {
    /// Model FLOPs over (median step time x GEMM peak).
    pub fn mfu(&self) -> f64 {
        self.model_flops / (self.median_step_s * self.gemm_peak_flops).max(f64::MIN_POSITIVE)
    }

    /// The step's floor on this machine: its model FLOPs at the measured GEMM peak, seconds.
    pub fn floor_s(&self) -> f64 {
        self.model_flops / self.gemm_peak_flops.max(f64::MIN_POSITIVE)
    }
}

impl StepReport {
    /// One JSON object, the field names of torch_train_step.py where they exist.
    pub fn to_json(&self) -> String {
        let rss = self
            .peak_rss_mib
            .map_or("null".to_string(), |r| format!("{r:.1}"));
        let sof = self
            .step_over_floor
            .map_or("null".to_string(), |r| format!("{r:.4}"));
        format!(
            "{{\"impl\": \"cannon\", \"dtype\": \"{}\", \"threads\": {}, \"nproc\": {}, \
             \"batch\": {}, \"seq\": {}, \"median_step_s\": {:.4}, \"min_step_s\": {:.4}, \
             \"tokens_per_s\": {:.1}, \"peak_rss_mib\": {rss}, \"trainable_params\": {}, \
             \"loss\": {:.4}, \"max_allocated_mib\": {:.1}, \"max_reserved_mib\": {:.1}, \
             \"model_gflop\": {:.3}, \"gemm_peak_gflops\": {:.1}, \"mfu\": {:.4}, \
             \"floor_s\": {:.4}, \"step_over_floor\": {sof}, \"device_allocs_per_step\": {:.1}}}",
            self.precision,
            self.threads,
            self.nproc,
            self.batch,
            self.seq,
            self.median_step_s,
            self.min_step_s,
            self.tokens_per_s,
            self.trainable_params,
            self.loss,
            self.max_allocated_mib,
            self.max_reserved_mib,
            self.model_flops / 1e9,
            self.gemm_peak_flops / 1e9,
            self.mfu(),
            self.floor_s(),
            self.device_allocs_per_step,
        )
    }
}

/// Uniform in `[-1, 1)` from 24 random bits.
fn unit(rng: &mut SplitMix64) -> f32 {
    (rng.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// Random host groups of `cfg` (one `Vec` per group of its `ParamLayout`): HF's init, as the
/// PyTorch script's model has (norm weights 1, everything else normal with the configs'
/// initializer_range), drawn by the model's own [`crate::model::init`].
pub fn random_host(cfg: &Mistral3Config, seed: u64) -> Vec<Vec<f32>> {
    let layout = crate::model::ParamLayout::new(cfg);
    let init = crate::model::init::Init::Normal(crate::model::init::INITIALIZER_RANGE);
    crate::model::init::random_host(&layout, seed, init)
}

/// A model of `cfg` with [`random_host`] weights on `exec`, made on the host and uploaded
/// once.
pub fn random_model(
    cfg: &Mistral3Config,
    exec: DeviceCtx,
    seed: u64,
) -> Result<Mistral3, ModelError> {
    let layout = crate::model::ParamLayout::new(cfg);
    let host = random_host(cfg, seed);
    let params = crate::model::Params::from_host(&exec, layout, &host)?;
    Ok(Mistral3 {
        cfg: cfg.clone(),
        params,
        loss_mode: LossMode::Full,
        memory: Default::default(),
        exec,
    })
}

/// The script's batch: `rows` rows of `seq` tokens, each starting with one `img` x `img`
/// image (random pixels in [-1, 1)).
pub fn bench_batch(
    cfg: &Mistral3Config,
    rows: usize,
    seq: usize,
    img: usize,
    seed: u64,
) -> Result<Batch, ModelError> {
    let cell = cfg.vision_config.patch_size * cfg.spatial_merge_size;
    let side = img / cell.max(1);
    if side == 0 || !img.is_multiple_of(cell) {
        return Err(ModelError::Input(format!(
            "--img {img} must be a positive multiple of patch_size x spatial_merge_size = {cell}"
        )));
    }
    let mut img_toks = Vec::with_capacity(side * (side + 1));
    for _ in 0..side {
        img_toks.extend(std::iter::repeat_n(cfg.image_token_index, side));
        img_toks.push(IMG_BREAK);
    }
    *img_toks.last_mut().unwrap_or(&mut 0) = IMG_END;
    let vocab = cfg.text_config.vocab_size as u64;
    if 1 + img_toks.len() >= seq || vocab <= 16 {
        return Err(ModelError::Input(format!(
            "--seq {seq} must exceed the image's {} tokens + BOS, and the vocabulary ({vocab}) 16",
            img_toks.len()
        )));
    }
    let mut rng = SplitMix64::new(seed ^ 0x5eed);
    let (mut ids, mut labels) = (
        Vec::with_capacity(rows * seq),
        Vec::with_capacity(rows * seq),
    );
    for _ in 0..rows {
        let prompt = 1 + img_toks.len();
        ids.push(1);
        ids.extend(&img_toks);
        while !ids.len().is_multiple_of(seq) {
            ids.push(16 + rng.below(vocab - 16) as u32);
        }
        let row = &ids[ids.len() - seq..];
        labels.extend(row.iter().enumerate().map(
            |(i, &t)| {
                if i < prompt {
                    IGNORE_INDEX
                } else {
                    t as i32
                }
            },
        ));
    }
    let c = cfg.vision_config.num_channels;
    let pixel_values = (0..rows * c * img * img).map(|_| unit(&mut rng)).collect();
    Ok(Batch {
        rows,
        seq,
        input_ids: ids,
        labels,
        images: Images {
            channels: c,
            pixel_values,
            sizes: vec![(img, img); rows],
        },
        ..Batch::default()
    })
}

/// The process's peak resident set in MiB (Linux `VmHWM`).
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Times `b.warmup + b.steps` full training steps of a random model of `cfg` on the host:
/// the one step every run takes ([`FsdpRank::step`]), on a world of one.
pub fn run(cfg: &Mistral3Config, b: &StepBench) -> Result<StepReport, FsdpError> {
    match b.precision {
        Precision::F32 => run_as::<f32>(cfg, b),
        Precision::Bf16 => run_as::<half::bf16>(cfg, b),
    }
}

/// The script's optimizer and clipping, the parts it trains (the text model).
pub(crate) fn bench_settings() -> FsdpSettings {
    FsdpSettings {
        adamw: AdamWConfig {
            lr: 1e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        },
        max_grad_norm: 1.0,
        frozen: vec![Part::Vision, Part::Projector],
        loss_mode: LossMode::Full,
        memory: Default::default(),
    }
}

fn run_as<A: ActElem>(cfg: &Mistral3Config, b: &StepBench) -> Result<StepReport, FsdpError> {
    if b.steps == 0 {
        return Err(ModelError::Input("--steps must be > 0".into()).into());
    }
    // A private allocator: the figures (peaks, blocks taken per step) are the model's own,
    // untouched by anything else the process runs (tests run benches side by side).
    let exec = DeviceCtx::with_allocator(
        std::sync::Arc::new(cannon_runtime::Stream::cpu()),
        cannon_runtime::CachingAllocator::new_cpu(),
    )?;
    let batch = bench_batch(cfg, b.batch, b.seq, b.img, b.seed)?;
    let settings = bench_settings();
    let comm = Communicator::solo(exec.device(), std::time::Duration::from_secs(600));
    // [`random_host`]'s weights, drawn where the rank keeps them.
    let source = ShardSource::Random {
        seed: b.seed,
        init: Init::Normal(INITIALIZER_RANGE),
    };
    let mut rank = FsdpRank::new(comm, exec.clone(), cfg.clone(), source, settings.clone())?;
    let text = [Part::Text];
    let trainable_params = ParamLayout::new(cfg)
        .groups
        .iter()
        .filter(|g| text.contains(&g.part))
        .map(|g| g.len)
        .sum();
    // The GEMM peaks (at start-up, and beside every step: `StepReport::step_over_floor`) run
    // on operands allocated once from their own allocator, so they are in neither the model's
    // allocator figures nor its cache.
    let probe_exec = DeviceCtx::with_allocator(
        std::sync::Arc::new(cannon_runtime::Stream::cpu()),
        cannon_runtime::CachingAllocator::new_cpu(),
    )?;
    let mut probe = GemmProbe::<A>::new(&probe_exec, b.precision, GEMM_PEAK_N)?;
    let gemm_peak_flops = probe.best(4)?;
    let model_flops = step_flops(cfg, &batch, &text).total;
    let alloc = exec.allocator().clone();
    let mut rates = vec![probe.best(2)?];
    let (mut times, mut loss, mut allocs0) = (Vec::with_capacity(b.steps), 0.0, 0);
    let (mut max_allocated, mut max_reserved) = (0, 0);
    for i in 0..b.warmup + b.steps {
        if i == b.warmup {
            allocs0 = alloc.stats().num_device_allocs;
        }
        let t0 = Instant::now();
        let st = rank.step::<A>(std::slice::from_ref(&batch), settings.adamw.lr)?;
        exec.stream()
            .synchronize()
            .map_err(cannon_kernels::KernelError::from)?;
        let dt = t0.elapsed().as_secs_f64();
        loss = st.loss;
        rates.push(probe.best(2)?);
        if i >= b.warmup {
            times.push(dt);
            max_allocated = max_allocated.max(st.memory.max_allocated);
            max_reserved = max_reserved.max(st.memory.max_reserved);
        }
    }
    let mut over: Vec<f64> = times
        .iter()
        .zip(rates[b.warmup..].windows(2))
        .map(|(t, r)| t * 0.5 * (r[0] + r[1]) / model_flops)
        .collect();
    over.sort_by(f64::total_cmp);
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let stats = alloc.stats();
    let mib = |bytes: usize| bytes as f64 / (1024.0 * 1024.0);
    Ok(StepReport {
        precision: b.precision,
        threads: rayon::current_num_threads(),
        nproc: 1,
        batch: b.batch,
        seq: b.seq,
        median_step_s: median,
        min_step_s: times[0],
        tokens_per_s: (b.batch * b.seq) as f64 / median,
        peak_rss_mib: peak_rss_mib(),
        trainable_params,
        loss,
        max_allocated_mib: mib(max_allocated),
        max_reserved_mib: mib(max_reserved),
        model_flops,
        gemm_peak_flops: rates.iter().cloned().fold(gemm_peak_flops, f64::max),
        device_allocs_per_step: (stats.num_device_allocs - allocs0) as f64 / b.steps as f64,
        step_over_floor: Some(over[over.len() / 2]),
    })
}

pub(crate) mod features;
pub(crate) mod sharded;
#[cfg(test)]
mod tests;
