//! A run's plan: a [`TrainConfig`] resolved against the machine into paths, a model source
//! and the parts it freezes ([`ResolvedRun`]), with what deciding them needs: the default run
//! folder (a job's shared one under `cannon launch`), the built-in synthetic set (made into
//! the cache under a temporary name), the model's config for a preset or an HF folder, the
//! step count of an epoch budget, and the weight files of an HF folder.

use super::error::{io, TrainError};
use crate::model::{weights, Mistral3Config, ModelError, Part};
use crate::train::config::{self, preset, ConfigError, Resume, TrainConfig};
use crate::train::data::image::ImageConfig;
use crate::train::data::shuffle::{Position, Shuffler};
use crate::train::data::{synth, DataConfig, Tekken};
use std::path::{Path, PathBuf};

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

/// The file of a model folder `data.system = "model"` reads (Magistral ships its default
/// system prompt there).
pub const SYSTEM_PROMPT_FILE: &str = "SYSTEM_PROMPT.txt";
/// The tokenizer file of a model folder (Mistral's name for it).
pub const MODEL_TOKENIZER_FILE: &str = "tekken.json";
/// The value of `data.system` that reads [`SYSTEM_PROMPT_FILE`].
pub const SYSTEM_FROM_MODEL: &str = "model";

/// The model folder's system prompt, as written (a missing file is an error naming it).
pub fn read_system_prompt(dir: &Path) -> Result<String, TrainError> {
    let path = dir.join(SYSTEM_PROMPT_FILE);
    if !path.is_file() {
        return Err(ConfigError::Invalid {
            key: "data.system",
            value: format!("{SYSTEM_FROM_MODEL:?}"),
            reason: format!("reads {}, which does not exist", path.display()),
        }
        .into());
    }
    crate::bounded::read_to_string_capped(&path, crate::bounded::MAX_SMALL_FILE).map_err(io(&path))
}

/// Where the run's tokenizer was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenizerFrom {
    /// `data.tokenizer`.
    Config,
    /// The model folder's `tekken.json`.
    ModelFolder,
    /// The project's shared tokenizer (by default or named): a preset's, or a model folder's
    /// without one. Its `image` section is Pixtral-12B's, which the presets do not follow, so
    /// it is not checked against the model.
    Shared,
}

/// A config resolved against the machine: every path decided, nothing written.
#[derive(Debug, Clone)]
pub struct ResolvedRun {
    /// The config as given (defaults filled in).
    pub cfg: TrainConfig,
    /// The file given with `--config`, if any.
    pub config_file: Option<PathBuf>,
    pub out_dir: PathBuf,
    pub jsonl: PathBuf,
    pub checkpoint_dir: PathBuf,
    pub tokenizer: PathBuf,
    pub tokenizer_from: TokenizerFrom,
    /// The system prompt for samples that bring none: `data.system`, or with `"model"` the
    /// text of the model folder's [`SYSTEM_PROMPT_FILE`].
    pub system: Option<String>,
    pub dataset: PathBuf,
    pub eval_dataset: Option<PathBuf>,
    /// The dataset index cache (`data.cache_dir`, or `index` in the cache folder).
    pub cache_dir: PathBuf,
    /// The synthetic set to generate first, when the default dataset is not in the cache yet.
    pub synth: Option<SynthPlan>,
    pub model: ModelSource,
    pub frozen: Vec<Part>,
}

impl ResolvedRun {
    /// Where the run's TensorBoard event files go (`<log.dir>/tensorboard`), if it writes them.
    pub fn tensorboard_dir(&self) -> Option<PathBuf> {
        self.cfg
            .log
            .tensorboard
            .then(|| self.out_dir.join("tensorboard"))
    }

    /// Resolves `cfg` (already validated): the default dataset and tokenizer, the run folder.
    pub fn resolve(cfg: TrainConfig, config_file: Option<&Path>) -> Result<Self, TrainError> {
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
        if cfg.data.eval_split > 0.0 {
            // The held-out part of the training set replaces the synthetic set's own.
            eval_dataset = None;
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
        let in_folder = match &model {
            ModelSource::Dir(dir) => Some(dir.join(MODEL_TOKENIZER_FILE)).filter(|p| p.is_file()),
            ModelSource::Preset(..) => None,
        };
        let system = match (cfg.data.system.as_deref(), &model) {
            (Some(SYSTEM_FROM_MODEL), ModelSource::Dir(dir)) => Some(read_system_prompt(dir)?),
            (other, _) => other.map(str::to_string),
        };
        let (tokenizer, tokenizer_from) = match (&cfg.data.tokenizer, in_folder) {
            (Some(p), _) if config::is_shared_tokenizer(p) => (p.clone(), TokenizerFrom::Shared),
            (Some(p), _) => (p.clone(), TokenizerFrom::Config),
            (None, Some(p)) => (p, TokenizerFrom::ModelFolder),
            (None, None) => (config::default_tokenizer()?, TokenizerFrom::Shared),
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
        let cache_dir = cfg
            .data
            .cache_dir
            .clone()
            .unwrap_or_else(|| config::cache_dir().join("index"));
        Ok(ResolvedRun {
            cfg,
            config_file: config_file.map(Path::to_path_buf),
            out_dir,
            jsonl,
            checkpoint_dir,
            tokenizer,
            tokenizer_from,
            system,
            dataset,
            eval_dataset,
            cache_dir,
            synth,
            model,
            frozen,
        })
    }

    /// The files of the model folder a trained model carries on (`name`, where it is now):
    /// the run's tokenizer as `tekken.json` (unless it is the project's shared one, which a
    /// preset's folder must not claim as its own) and the folder's `SYSTEM_PROMPT.txt`. The
    /// final model, every checkpoint and `cannon export` write them, so that a fine-tuned
    /// model's folder is one a later run (or a server) reads its tokenizer from.
    pub fn model_folder_files(&self) -> Vec<(&'static str, PathBuf)> {
        let mut files = Vec::new();
        if self.tokenizer_from != TokenizerFrom::Shared {
            files.push((MODEL_TOKENIZER_FILE, self.tokenizer.clone()));
        }
        if let ModelSource::Dir(dir) = &self.model {
            let prompt = dir.join(SYSTEM_PROMPT_FILE);
            if prompt.is_file() {
                files.push((SYSTEM_PROMPT_FILE, prompt));
            }
        }
        files
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
        // The prompt itself: the run's folder keeps it even if the model folder changes.
        c.data.system = self.system.clone();
        if let ModelSource::Preset(..) = self.model {
            // What the preset decided, written in: a run started again from this config, or
            // evaluated from its checkpoint folder, reads its samples the same way.
            c.data.vocab_size.get_or_insert(preset::PRESET_VOCAB);
            c.data
                .longest_edge
                .get_or_insert(preset::PRESET_LONGEST_EDGE);
        }
        c.data.cache_dir = Some(self.cache_dir.clone());
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

    /// The data settings of the loader, with what [`super::samples::SampleSetup`] decided
    /// (the image settings and the system prompt).
    pub fn data_config(&self, image: ImageConfig, system: Option<String>) -> DataConfig {
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
            system_prompt: system,
            image,
            labels: d.labels(),
            cache_dir: Some(self.cache_dir.clone()),
            eval_split: d.eval_split,
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
/// and an existing set is never written over (when two runs make it at once, the first
/// rename wins and the other drops its copy).
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
    match std::fs::rename(&tmp, &p.dir) {
        // Another process made the same set meanwhile (runs started together, on one node):
        // it is the same set (same generator, size and seed), so theirs is kept.
        Err(_) if p.dir.join(synth::HELDOUT).is_file() => {
            std::fs::remove_dir_all(&tmp).map_err(io(&tmp))
        }
        r => r.map_err(io(&p.dir)),
    }
}

/// The image processor settings a model needs: its patch and merge sizes, the run's longest
/// edge (a run's own, with its pixel limits, are [`super::samples::SampleSetup::image`]).
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
            let (cfg, json) = dir_config(dir)?;
            check_ids_fit(tok, &cfg)?;
            Ok((cfg, json))
        }
    }
}

/// An HF folder's `config.json`, parsed and as JSON (the file read once).
pub fn dir_config(dir: &Path) -> Result<(Mistral3Config, serde_json::Value), TrainError> {
    let path = dir.join("config.json");
    let text = crate::bounded::read_to_string_capped(&path, crate::model::config::MAX_CONFIG_BYTES)
        .map_err(io(&path))?;
    let cfg = Mistral3Config::from_json(&text).map_err(ModelError::from)?;
    let json = serde_json::from_str(&text)
        .map_err(|e| TrainError::Input(format!("{}: {e}", path.display())))?;
    Ok((cfg, json))
}

/// A tokenizer whose ids run past the model's embedding is an error naming both sizes.
pub fn check_ids_fit(tok: &Tekken, cfg: &Mistral3Config) -> Result<(), TrainError> {
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
    Ok(())
}

/// Optimizer steps of `epochs` passes over `lengths` (sample lengths in tokens): whole
/// batches until at least `epochs x samples` samples were consumed. Packed rows are filled
/// exactly as the loader fills them (in the shuffled stream order), so the count is exact.
pub fn steps_for_epochs(lengths: &[usize], epochs: f64, plan: &ResolvedRun) -> usize {
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
