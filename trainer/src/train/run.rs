//! A training run: a [`TrainConfig`] resolved into paths and a model source ([`RunPlan`]),
//! then data, tokenizer and model made ready ([`Trainer::new`]) and trained
//! ([`Trainer::run`]): micro batches from the [`Loader`], gradient accumulation normalised
//! over the step's targets, the LR schedule, clipping, AdamW, per-step metrics, and the
//! held-out evaluation at the end.
//!
//! Everything a checkpoint must hold to continue the run bit for bit is in [`TrainState`]:
//! the step, the schedule (a pure function of the step), the loader's position (the data
//! order is a function of the seed and the position, so the loop draws no other random
//! numbers), the consumed and dropped sample counts, and the model's parameters with the
//! AdamW state. A [`StepHook`] runs after every optimizer step with that state: that is where
//! saving checkpoints plugs in. Resuming is building a [`Trainer`], overwriting its state
//! with the saved one ([`Trainer::restore_position`] moves the loader) and calling `run`.

use super::flops::{gemm_peak, shape_flops};
use super::identity::RunIdentity;
use super::metrics::{EvalRecord, JsonlWriter, Progress, StepRecord};
use super::schedule::LrSchedule;
use super::step::{accumulate, memory_features};
use crate::config::{self, preset, ConfigError, Dtype, Resume, TrainConfig};
use crate::data::dataset::DataSet;
use crate::data::image::ImageConfig;
use crate::data::info::DatasetSpec;
use crate::data::shuffle::{Position, Shuffler};
use crate::data::{synth, DataConfig, DataError, Loader, Tekken};
use crate::eval::{self, EvalError, EvalReport};
use crate::model::init::{self, Init};
use crate::model::optim::{clip_grad_norm, AdamW, AdamWConfig};
use crate::model::{
    weights, Act, Exec, Grads, Mistral3, Mistral3Config, ModelError, ParamLayout, Part,
};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("data: {0}")]
    Data(#[from] DataError),
    #[error("model: {0}")]
    Model(#[from] ModelError),
    #[error(transparent)]
    Eval(#[from] EvalError),
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Input(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Seed of the synthetic set the default run makes (fixed, so every machine trains on the
/// same data).
pub const SYNTH_SEED: u64 = 1234;

/// Where the model's config comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSource {
    Preset(String, preset::PresetSizes),
    /// An HF model directory (its `config.json`).
    Dir(PathBuf),
}

/// The synthetic set a run makes before it starts (absent from the cache).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SynthPlan {
    pub dir: PathBuf,
    pub samples: usize,
    pub seed: u64,
}

/// A config resolved against the machine: every path decided, nothing written.
#[derive(Debug, Clone)]
pub struct RunPlan {
    /// The config as given (defaults filled in).
    pub cfg: TrainConfig,
    /// The file given with `--config`, if any.
    pub config_file: Option<PathBuf>,
    pub out_dir: PathBuf,
    pub jsonl: PathBuf,
    pub checkpoint_dir: PathBuf,
    pub tokenizer: PathBuf,
    pub dataset: PathBuf,
    pub eval_dataset: Option<PathBuf>,
    /// The synthetic set to generate first, when the default dataset is not in the cache yet.
    pub synth: Option<SynthPlan>,
    pub model: ModelSource,
    pub frozen: Vec<Part>,
}

impl RunPlan {
    /// Resolves `cfg` (already validated): the default dataset and tokenizer, the run folder.
    pub fn resolve(cfg: TrainConfig, config_file: Option<&Path>) -> Result<Self, TrainError> {
        let tokenizer = match &cfg.data.tokenizer {
            Some(p) => p.clone(),
            None => config::default_tokenizer()?,
        };
        let (dataset, mut eval_dataset, synth) = match &cfg.data.dataset {
            Some(p) => (p.clone(), None, None),
            None => {
                let dir = config::cache_dir().join(format!(
                    "synth-shapes-v{}-{}-seed{SYNTH_SEED}",
                    synth::VERSION,
                    cfg.data.synth_samples
                ));
                let plan = (!dir.join("heldout.jsonl").is_file()).then(|| SynthPlan {
                    dir: dir.clone(),
                    samples: cfg.data.synth_samples,
                    seed: SYNTH_SEED,
                });
                (
                    dir.join("train.jsonl"),
                    Some(dir.join("heldout.jsonl")),
                    plan,
                )
            }
        };
        if let Some(e) = &cfg.data.eval_dataset {
            eval_dataset = Some(e.clone());
        }
        let model = match preset::sizes(&cfg.model.config) {
            Some(s) => ModelSource::Preset(cfg.model.config.clone(), s),
            None => {
                let dir = PathBuf::from(&cfg.model.config);
                if !dir.join("config.json").is_file() {
                    return Err(ConfigError::Invalid {
                        key: "model.config",
                        value: format!("{:?}", cfg.model.config),
                        reason: format!(
                            "neither a built-in preset ({}) nor a directory with config.json",
                            preset::PRESETS.join(", ")
                        ),
                    }
                    .into());
                }
                ModelSource::Dir(dir)
            }
        };
        let out_dir = match &cfg.log.dir {
            Some(d) => d.clone(),
            None => default_run_dir(Path::new("runs"))?,
        };
        let jsonl = cfg
            .log
            .jsonl
            .clone()
            .unwrap_or_else(|| out_dir.join("metrics.jsonl"));
        let checkpoint_dir = cfg
            .checkpoint
            .dir
            .clone()
            .unwrap_or_else(|| out_dir.join("checkpoints"));
        let frozen = cfg.frozen();
        Ok(RunPlan {
            cfg,
            config_file: config_file.map(Path::to_path_buf),
            out_dir,
            jsonl,
            checkpoint_dir,
            tokenizer,
            dataset,
            eval_dataset,
            synth,
            model,
            frozen,
        })
    }

    /// The config with every resolved path written in: what is printed at the start and
    /// saved as the run folder's `config.toml` (running it again reproduces the run, in
    /// another folder if `log.dir` is changed).
    pub fn effective(&self) -> TrainConfig {
        let mut c = self.cfg.clone();
        if c.train.steps.is_none() && c.train.epochs.is_none() {
            c.train.steps = Some(config::DEFAULT_STEPS);
        }
        c.data.dataset = Some(self.dataset.clone());
        c.data.eval_dataset = self.eval_dataset.clone();
        c.data.tokenizer = Some(self.tokenizer.clone());
        c.log.dir = Some(self.out_dir.clone());
        c.log.jsonl = Some(self.jsonl.clone());
        c.checkpoint.dir = Some(self.checkpoint_dir.clone());
        c.model.freeze = Some(
            self.frozen
                .iter()
                .map(|p| match p {
                    Part::Vision => config::FreezePart::Vision,
                    Part::Projector => config::FreezePart::Projector,
                    Part::Text => config::FreezePart::Text,
                })
                .collect(),
        );
        c
    }

    /// The data settings of the loader.
    pub fn data_config(&self, image: ImageConfig) -> DataConfig {
        let d = &self.cfg.data;
        DataConfig {
            dataset: Some(self.dataset.clone()),
            dataset_dir: d.dataset_dir.clone(),
            tokenizer: Some(self.tokenizer.clone()),
            vocab_size: d.vocab_size,
            max_len: d.max_len,
            batch_size: self.cfg.train.micro_batch,
            pack: d.packing,
            pad_to_multiple_of: 8,
            seed: self.cfg.train.seed,
            system_prompt: d.system_prompt.clone(),
            image,
        }
    }
}

/// The environment variable that names the run folder of a job of several processes (set by
/// `cannon launch` on one node; every process of the job must see the same value).
pub const RUN_ID_ENV: &str = "CANNON_RUN_ID";

/// The run folder when `log.dir` is not set: `<root>/<CANNON_RUN_ID>` in a job whose launcher
/// named it, else a fresh `<root>/<UTC yyyymmdd-hhmmss>` for a single process. A job of several
/// processes (`WORLD_SIZE` > 1) without either is an error: each process would name its own
/// folder from its own start time, and a checkpoint's shards would land in different folders.
fn default_run_dir(root: &Path) -> Result<PathBuf, TrainError> {
    if let Some(id) = std::env::var(RUN_ID_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        let id = id.trim();
        if Path::new(id).components().count() != 1 || id == "." || id == ".." {
            return Err(TrainError::Input(format!(
                "{RUN_ID_ENV}={id:?} is not a folder name (one path component)"
            )));
        }
        return Ok(root.join(id));
    }
    let world: usize = std::env::var("WORLD_SIZE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(1);
    if world > 1 {
        return Err(TrainError::Input(format!(
            "this process is one of a job of {world} (WORLD_SIZE) and log.dir is not set: give \
             the job one run folder with --set log.dir=DIR (cannon launch on one node names one \
             for you through {RUN_ID_ENV})"
        )));
    }
    Ok(root.join(run_id_now(root)))
}

/// A fresh run name under `root`: `<UTC yyyymmdd-hhmmss>`, with `-2`, `-3`, ... if that folder
/// exists.
pub fn run_id_now(root: &Path) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let base = utc_stamp(secs);
    let mut id = base.clone();
    let mut k = 2;
    while root.join(&id).exists() {
        id = format!("{base}-{k}");
        k += 1;
    }
    id
}

/// `yyyymmdd-hhmmss` of a Unix time (UTC; the civil-from-days algorithm of H. Hinnant).
pub fn utc_stamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Generates the synthetic set into a temporary sibling folder and renames it into place, so
/// that an interrupted generation never leaves a half set where a complete one is expected,
/// and an existing set is never written over.
pub fn make_synth(p: &SynthPlan) -> Result<(), TrainError> {
    if p.dir.exists() {
        return Err(TrainError::Input(format!(
            "{} exists but holds no heldout.jsonl: not writing over it; remove it to let the \
             default run make the synthetic set again",
            p.dir.display()
        )));
    }
    let parent = p.dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let name = p
        .dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("synth");
    let tmp = parent.join(format!(".{name}.partial-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    synth::write(&tmp, p.samples, p.seed)?;
    std::fs::rename(&tmp, &p.dir).map_err(io(&p.dir))
}

/// The image processor settings a model needs: its patch and merge sizes, the run's longest
/// edge.
pub fn image_config(cfg: &Mistral3Config, longest_edge: u32) -> ImageConfig {
    ImageConfig {
        longest_edge,
        patch_size: cfg.vision_config.patch_size as u32,
        merge_size: cfg.spatial_merge_size as u32,
        ..ImageConfig::default()
    }
}

/// The model's config and its `config.json` contents for `source` and the tokenizer.
pub fn model_config(
    source: &ModelSource,
    tok: &Tekken,
) -> Result<(Mistral3Config, serde_json::Value), TrainError> {
    match source {
        ModelSource::Preset(_, sizes) => {
            let img = tok
                .special_id("[IMG]")
                .ok_or_else(|| TrainError::Input("the tokenizer has no [IMG] token".into()))?;
            let patch = ImageConfig::default().patch_size as usize;
            let json = preset::config_json(*sizes, tok.vocab_size() as usize, img, patch);
            let cfg = Mistral3Config::from_json(&json.to_string()).map_err(ModelError::from)?;
            Ok((cfg, json))
        }
        ModelSource::Dir(dir) => {
            let path = dir.join("config.json");
            let cfg = Mistral3Config::from_file(&path).map_err(ModelError::from)?;
            let text = std::fs::read_to_string(&path).map_err(io(&path))?;
            let json = serde_json::from_str(&text)
                .map_err(|e| TrainError::Input(format!("{}: {e}", path.display())))?;
            if tok.vocab_size() as usize > cfg.text_config.vocab_size {
                return Err(ConfigError::Invalid {
                    key: "data.vocab_size",
                    value: tok.vocab_size().to_string(),
                    reason: format!(
                        "the tokenizer's ids do not fit the model's vocabulary ({})",
                        cfg.text_config.vocab_size
                    ),
                }
                .into());
            }
            Ok((cfg, json))
        }
    }
}

/// Optimizer steps of `epochs` passes over `lengths` (sample lengths in tokens): whole
/// batches until at least `epochs x samples` samples were consumed. Packed rows are filled
/// exactly as the loader fills them (in the shuffled stream order), so the count is exact.
pub fn steps_for_epochs(lengths: &[usize], epochs: f64, plan: &RunPlan) -> usize {
    let n = lengths.len();
    let t = &plan.cfg.train;
    let per_step = t.micro_batch * t.grad_accum;
    let want = (epochs * n as f64).ceil() as u64;
    if !plan.cfg.data.packing {
        return (want.div_ceil(per_step as u64) as usize).max(1);
    }
    let max_len = plan.cfg.data.max_len;
    let mut order = Shuffler::new(n, t.seed, Position::default()).peekable();
    let (mut consumed, mut steps) = (0u64, 0usize);
    while consumed < want {
        for _ in 0..per_step {
            let mut used = 0;
            while let Some(&i) = order.peek() {
                if used > 0 && used + lengths[i] > max_len {
                    break;
                }
                used += lengths[i];
                order.next();
                consumed += 1;
            }
        }
        steps += 1;
    }
    steps.max(1)
}

/// Everything a checkpoint holds to continue the run bit for bit (see the module docs).
#[derive(Debug)]
pub struct TrainState {
    /// Optimizer steps done.
    pub step: usize,
    /// Optimizer steps of the whole run.
    pub total_steps: usize,
    /// The learning rate of step `s` is `schedule.at(s)`: its only state is `step`.
    pub schedule: LrSchedule,
    /// Where the loader's next micro batch starts.
    pub position: Position,
    /// Samples and non-padding tokens consumed so far.
    pub samples: u64,
    pub tokens: u64,
    /// Samples the dataset reading dropped (truncation would have cut an image block).
    pub dropped_samples: u64,
    /// Parameters (f32 master weights), on the model's device.
    pub model: Mistral3,
    /// AdamW's step count and moments of the trained groups.
    pub opt: AdamW,
    /// The gradient buffers of the trained groups (scratch between steps, not state).
    pub grads: Grads,
    /// Parts that train.
    pub trainable: Vec<Part>,
}

/// Runs after every optimizer step, with the state as it stands after that step's update:
/// where checkpoints are saved. An error stops the run.
pub trait StepHook {
    fn after_step(&mut self, plan: &RunPlan, state: &TrainState) -> Result<(), TrainError>;
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub steps: usize,
    /// Loss of each step run in this call.
    pub losses: Vec<f64>,
    pub wall_s: f64,
    pub eval: Option<EvalReport>,
    /// Where the final model was written (`config.json` + `model.safetensors`).
    pub final_model: PathBuf,
}

/// A run ready to train: data read, model built, state at step 0 (or wherever a checkpoint
/// put it).
pub struct Trainer {
    pub plan: RunPlan,
    pub tok: Tekken,
    pub loader: Loader,
    pub image: ImageConfig,
    pub state: TrainState,
    /// The model's `config.json` contents (written beside the final weights).
    pub model_json: serde_json::Value,
    /// The GEMM peak (FLOP/s) at the run's precision, measured at start-up for MFU.
    pub gemm_peak: f64,
    /// `(role, path)` of the run's input files, digested into `run_identity.json`.
    pub inputs: Vec<(String, PathBuf)>,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("out_dir", &self.plan.out_dir)
            .field("step", &self.state.step)
            .field("total_steps", &self.state.total_steps)
            .finish()
    }
}

impl Trainer {
    /// Makes the default synthetic set if needed, reads tokenizer and data, builds the model
    /// (HF weights or random init) and the optimizer, measures the GEMM peak. Writes nothing
    /// in the run folder yet.
    pub fn new(plan: RunPlan, exec: Exec) -> Result<Self, TrainError> {
        if let Some(s) = &plan.synth {
            eprintln!(
                "making the synthetic shapes set ({} samples) in {}",
                s.samples,
                s.dir.display()
            );
            make_synth(s)?;
        }
        let cfg = &plan.cfg;
        let tok = Tekken::from_file(&plan.tokenizer, cfg.data.vocab_size)?;
        let (mcfg, model_json) = model_config(&plan.model, &tok)?;
        // The CP layout against the model's heads, before any data or weights are read.
        cfg.parallel.cp().check(&mcfg)?;
        let image = image_config(&mcfg, cfg.data.longest_edge);
        let loader = Loader::open(&plan.data_config(image.clone()), &tok, Position::default())?;
        let stats = loader.stats().clone();
        let total_steps = match (cfg.train.steps, cfg.train.epochs) {
            (Some(s), _) => s,
            (None, Some(e)) => {
                let lengths: Vec<usize> = loader
                    .dataset()
                    .samples
                    .iter()
                    .map(|s| s.input_ids.len())
                    .collect();
                steps_for_epochs(&lengths, e, &plan)
            }
            (None, None) => config::DEFAULT_STEPS,
        };
        let layout = ParamLayout::new(&mcfg);
        let (loss_mode, memory) = memory_features(&cfg.train);
        let exec = match (memory.needs_host_pool(), exec.host_pool()) {
            (true, None) => exec.with_host_pool().map_err(ModelError::from)?,
            _ => exec,
        };
        let mut params = match (&cfg.model.weights, &plan.model) {
            (Some(dir), _) => weights::load_params(&exec, dir, layout)?,
            (None, ModelSource::Preset(..)) => {
                init::random_params(&exec, layout, cfg.model.seed, Init::FanIn)?
            }
            (None, ModelSource::Dir(_)) => init::random_params(
                &exec,
                layout,
                cfg.model.seed,
                Init::Normal(init::INITIALIZER_RANGE),
            )?,
        };
        if memory.offload_optimizer {
            // Into the host pool before the gradients and moments exist: start-up then holds
            // at most the f32 weights on the device, not weights, gradients and moments.
            params.offload(&exec)?;
            exec.allocator().empty_cache();
        }
        let model = Mistral3 {
            cfg: mcfg,
            params,
            loss_mode,
            memory,
            exec: exec.clone(),
        };
        let trainable: Vec<Part> = [Part::Vision, Part::Projector, Part::Text]
            .into_iter()
            .filter(|p| !plan.frozen.contains(p))
            .collect();
        if trainable.is_empty() {
            return Err(ConfigError::Invalid {
                key: "model.freeze",
                value: "[\"vision\", \"projector\", \"text\"]".into(),
                reason: "freezes every part: nothing would train".into(),
            }
            .into());
        }
        let grads = model.grads(&trainable)?;
        let t = &cfg.train;
        let adamw = AdamWConfig {
            lr: t.lr,
            beta1: t.betas[0],
            beta2: t.betas[1],
            eps: t.eps,
            weight_decay: t.weight_decay,
        };
        // Under the optimizer offload the moments are made in the host pool.
        let opt = match memory.offload_optimizer {
            true => AdamW::new_in_host_pool(&exec, adamw, &grads)?,
            false => AdamW::new(&exec, adamw, &grads)?,
        };
        let precision = t.dtype.precision();
        // On operands of their own allocator: the run's memory figures are the model's.
        let probe = exec.with_private_allocator().map_err(ModelError::from)?;
        let gemm_peak = gemm_peak(&probe, precision, 512, 4).map_err(ModelError::from)?;
        let schedule = LrSchedule {
            kind: t.schedule,
            lr: t.lr,
            min_lr: t.min_lr,
            warmup_steps: t.warmup_steps,
            total_steps,
        };
        let mut inputs = vec![
            ("dataset".to_string(), plan.dataset.clone()),
            ("tokenizer".to_string(), plan.tokenizer.clone()),
        ];
        if let Some(e) = &plan.eval_dataset {
            inputs.push(("eval_dataset".into(), e.clone()));
        }
        if let Some(c) = &plan.config_file {
            inputs.push(("config".into(), c.clone()));
        }
        if let ModelSource::Dir(d) = &plan.model {
            inputs.push(("model_config".into(), d.join("config.json")));
        }
        if let Some(w) = &cfg.model.weights {
            for f in weight_files(w)? {
                let name = f.file_name().map(|n| n.to_string_lossy().into_owned());
                inputs.push((format!("weights/{}", name.unwrap_or_default()), f));
            }
        }
        let state = TrainState {
            step: 0,
            total_steps,
            schedule,
            position: loader.position(),
            samples: 0,
            tokens: 0,
            dropped_samples: stats.dropped_truncated as u64,
            model,
            opt,
            grads,
            trainable,
        };
        Ok(Trainer {
            plan,
            tok,
            loader,
            image,
            state,
            model_json,
            gemm_peak,
            inputs,
        })
    }

    /// Moves the loader to the state's position (after a checkpoint overwrote the state).
    pub fn restore_position(&mut self) {
        self.loader.seek(self.state.position);
    }

    /// Writes the run folder's `config.toml` and `run_identity.json`, trains from the
    /// state's step to the last, writes the final model, and evaluates on the held-out set.
    pub fn run(&mut self, hooks: &mut [&mut dyn StepHook]) -> Result<RunSummary, TrainError> {
        match self.plan.cfg.train.dtype {
            Dtype::F32 => self.run_as::<f32>(hooks),
            Dtype::Bf16 => self.run_as::<half::bf16>(hooks),
        }
    }

    pub(crate) fn write_run_files(&self) -> Result<(), TrainError> {
        let out = &self.plan.out_dir;
        std::fs::create_dir_all(out).map_err(io(out))?;
        let cfg_path = out.join("config.toml");
        let text = format!(
            "# The effective config of this run (every default and resolved path written in).\n{}",
            self.plan.effective().to_toml()
        );
        std::fs::write(&cfg_path, text).map_err(io(&cfg_path))?;
        let mut files = self.inputs.clone();
        files.push(("effective_config".into(), cfg_path));
        let id =
            RunIdentity::new(&files).map_err(|(path, source)| TrainError::Io { path, source })?;
        let dir = self
            .plan
            .jsonl
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let id_path = dir.join("run_identity.json");
        let json = serde_json::to_string_pretty(&id).unwrap_or_default();
        std::fs::write(&id_path, json + "\n").map_err(io(&id_path))
    }

    fn run_as<A: Act>(
        &mut self,
        hooks: &mut [&mut dyn StepHook],
    ) -> Result<RunSummary, TrainError> {
        self.write_run_files()?;
        // A resumed state's weights and moments were restored where the checkpoint code put
        // them (into the host pool when the state was offloaded already; a state built
        // from a checkpoint elsewhere may be on the device): the offload is applied again.
        if self.state.model.memory.offload_optimizer {
            let exec = self.state.model.exec.clone();
            let s = &mut self.state;
            s.opt.offload(&exec, &mut s.model.params)?;
        }
        let resuming = self.state.step > 0;
        let mut jsonl =
            JsonlWriter::open(&self.plan.jsonl, resuming).map_err(io(&self.plan.jsonl))?;
        let started = Instant::now();
        let first = self.state.step;
        let total = self.state.total_steps;
        let mut progress = Progress::new(total, first);
        let mut losses = Vec::new();
        let every = self.plan.cfg.log.every;
        while self.state.step < total {
            let r = self.step::<A>()?;
            losses.push(r.loss);
            if !r.loss.is_finite() {
                return Err(TrainError::Input(format!(
                    "step {}: the loss is {} (lower train.lr or check the data)",
                    r.step, r.loss
                )));
            }
            if r.step % every == 0 || r.step == total {
                jsonl.write(&r).map_err(io(&self.plan.jsonl))?;
            }
            progress.update(&r, r.step - first);
            for h in hooks.iter_mut() {
                h.after_step(&self.plan, &self.state)?;
            }
        }
        progress.finish();
        let wall_s = started.elapsed().as_secs_f64();
        let (final_model, eval) = self.finish::<A>(&self.state.model, &mut jsonl)?;
        Ok(RunSummary {
            steps: self.state.step - first,
            losses,
            wall_s,
            eval,
            final_model,
        })
    }

    /// The end of a run: writes `model` (the trained weights) with the run's config into
    /// `<run folder>/final`, evaluates it on the held-out set if there is one, and logs the
    /// evaluation to `jsonl`.
    pub(crate) fn finish<A: Act>(
        &self,
        model: &Mistral3,
        jsonl: &mut JsonlWriter,
    ) -> Result<(PathBuf, Option<EvalReport>), TrainError> {
        let final_model = self.plan.out_dir.join("final");
        crate::model::save::save_hf(model, &self.model_json, &final_model)?;
        let cfg_copy = final_model.join(FINAL_RUN_CONFIG);
        std::fs::write(&cfg_copy, self.plan.effective().to_toml()).map_err(io(&cfg_copy))?;
        let eval = match &self.plan.eval_dataset {
            Some(path) => {
                let spec = DatasetSpec::resolve(path, self.plan.cfg.data.dataset_dir.as_deref())?;
                let data = DataSet::open(&spec, &self.tok, &self.loader_settings())?;
                let rep = eval::evaluate::<A>(
                    model,
                    &data,
                    &self.tok,
                    &self.image,
                    self.plan.cfg.train.eval_batch,
                )?;
                jsonl
                    .write(&EvalRecord { eval: &rep })
                    .map_err(io(&self.plan.jsonl))?;
                Some(rep)
            }
            None => None,
        };
        Ok((final_model, eval))
    }

    fn loader_settings(&self) -> crate::data::dataset::SampleSettings<'_> {
        crate::data::dataset::SampleSettings {
            max_len: self.plan.cfg.data.max_len,
            system_prompt: self.plan.cfg.data.system_prompt.as_deref(),
            image: &self.image,
        }
    }

    /// One optimizer step: `grad_accum` micro batches, clip, AdamW at the schedule's rate.
    pub fn step<A: Act>(&mut self) -> Result<StepRecord, TrainError> {
        let t0 = Instant::now();
        let st_exec = self.state.model.exec.clone();
        let alloc = st_exec.allocator();
        alloc.reset_peak();
        let accum = self.plan.cfg.train.grad_accum;
        let (mut micro, mut shapes) = (Vec::with_capacity(accum), Vec::with_capacity(accum));
        for _ in 0..accum {
            let (batch, shape) = self.loader.next_rows(|rows| 0..rows)?;
            micro.push(batch);
            shapes.push(shape);
        }
        let data_ms = t0.elapsed().as_secs_f64() * 1e3;
        let s = &mut self.state;
        let st = st_exec.stream();
        s.grads.zero(st)?;
        let acc = accumulate::<A>(&s.model, &micro, &mut s.grads)?;
        let lr = s.schedule.at(s.step);
        let (grad_norm, lr) = if acc.targets == 0 {
            // Nothing trained in this step (every answer cut away): no update, so AdamW's
            // moments and step count do not move either.
            (0.0, 0.0)
        } else {
            let g = clip_grad_norm(st, &mut s.grads, self.plan.cfg.train.max_grad_norm)
                .map_err(ModelError::from)?;
            s.opt
                .update(st, &mut s.model.params, &s.grads, lr)
                .map_err(ModelError::from)?;
            (g, lr)
        };
        st.synchronize().map_err(ModelError::from)?;
        let step_s = t0.elapsed().as_secs_f64();
        let mem = alloc.stats();
        // The caching allocator serves a request only from a cached block of its rounded
        // size or at most 1/8 larger, and the synthetic set's batches come in many shapes
        // (image sizes, padded lengths): without a release the cache grows by every new
        // shape (to ~10 GB over the default run for a 130 MB working set). Releasing it when it holds more
        // than CACHE_SLACK times the step's peak keeps the steady-shape reuse and bounds
        // the memory.
        if mem.reserved > CACHE_SLACK * mem.peak_allocated.max(1 << 24) {
            alloc.empty_cache();
        }
        // As a sharded run counts them (from the batches' shapes, see `train::sharded`).
        let tokens: u64 = shapes.iter().map(|b| b.sample_tokens as u64).sum();
        let samples: u64 = shapes.iter().map(|b| b.samples as u64).sum();
        let flops: f64 = shapes
            .iter()
            .map(|b| shape_flops(&s.model.cfg, b, &s.trainable).total)
            .sum();
        s.step += 1;
        s.samples += samples;
        s.tokens += tokens;
        s.position = self.loader.position();
        const MIB: f64 = 1024.0 * 1024.0;
        Ok(StepRecord {
            step: s.step,
            loss: acc.loss,
            grad_norm,
            lr,
            step_ms: step_s * 1e3,
            data_ms,
            tokens_per_s: tokens as f64 / step_s,
            mfu: flops / (step_s * self.gemm_peak),
            max_allocated_mib: mem.peak_allocated as f64 / MIB,
            max_reserved_mib: mem.peak_reserved as f64 / MIB,
            dropped_samples: s.dropped_samples,
            samples: s.samples,
            tokens: s.tokens,
            targets: acc.targets,
        })
    }
}

/// How many times a step's peak allocation the allocator may keep reserved before the loop
/// releases its cache (see [`Trainer::step`]).
pub const CACHE_SLACK: usize = 4;

/// The copy of the run config saved beside the final weights (what `cannon eval` reads).
pub const FINAL_RUN_CONFIG: &str = "cannon_train.toml";

/// The safetensors files (and index) of an HF weights directory.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, TrainError> {
    let index = dir.join("model.safetensors.index.json");
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    if !index.is_file() {
        return Err(ModelError::from(weights::WeightsError::NoWeights(dir.to_path_buf())).into());
    }
    let mut files = vec![index.clone()];
    let rd = std::fs::read_dir(dir).map_err(io(dir))?;
    let mut shards: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    shards.sort();
    files.extend(shards);
    Ok(files)
}

/// Whether `cfg.checkpoint.resume` asks for a checkpoint (see [`super::resume`]).
pub fn wants_resume(cfg: &TrainConfig) -> bool {
    !matches!(cfg.checkpoint.resume, Resume::Latest(false))
}
