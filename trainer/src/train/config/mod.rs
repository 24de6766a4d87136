//! The run configuration of `cannon train`: a TOML file in sections, as MindSpeed-MM's YAML
//! recipes are laid out, every key optional (the defaults are the built-in tiny run).
//!
//! ```toml
//! [model]
//! config = "tiny"            # a built-in preset, or an HF model directory (config.json)
//! # weights = "path/to/dir"  # safetensors (sharded or not); absent: random init from `seed`
//! seed = 0
//! # freeze = ["vision", "projector"]   # default: these two for an HF model, nothing for a preset
//!
//! [data]
//! # dataset = "train.jsonl"  # absent: the synthetic shapes set, made in the cache folder
//! # eval_dataset = "heldout.jsonl"
//! # eval_split = 0.05        # or this fraction of the training set held out (not both)
//! # tokenizer = "tekken.json"  # absent: the model folder's tekken.json (the project's for a preset)
//! # vocab_size = 1280        # absent: the model's (1280 for the tiny preset)
//! max_len = 512
//! packing = false
//! # longest_edge = 112       # absent: the model's image size (112 for the tiny preset)
//! # image_max_pixels = 262144  # LLaMA-Factory's pixel limits, applied before the processor
//! # image_min_pixels = 1024
//! # system = "model"         # the model folder's SYSTEM_PROMPT.txt, or a literal prompt
//! train_on_prompt = false
//! mask_history = false
//! # cache_dir = "idx"        # the dataset index cache; absent: <cache folder>/index
//!
//! [train]
//! micro_batch = 64
//! grad_accum = 1
//! steps = 2500               # or epochs = 2.0
//! lr = 1e-3
//! schedule = "cosine"        # or "constant"
//! warmup_steps = 50
//! min_lr = 1e-4
//! weight_decay = 0.0
//! betas = [0.9, 0.95]
//! eps = 1e-8
//! max_grad_norm = 1.0
//! max_skipped_steps = 5     # consecutive non-finite steps skipped before the run stops
//! max_abs_weight = 1e6       # a checkpoint with a larger |weight| is refused (diverged)
//! seed = 42
//! dtype = "f32"              # or "bf16"
//! eval_every = 0             # steps between validation losses (and at the end); 0: none
//! # profile_steps = [3, 4]   # a Chrome trace of these steps (first, last) in <log.dir>/trace.json
//! loss_chunk = 0             # > 0: lm_head + loss per chunk of this many tokens
//! recompute = "none"         # or "full", "selective" (per decoder layer)
//! offload_activations = false
//! offload_optimizer = false
//!
//! [parallel]
//! nproc = 1
//! fsdp = true
//! cp_size = 1                # context parallel ranks (nproc = dp x cp_size)
//! cp_algo = "ulysses"        # or "ring", "hybrid"
//! # ulysses_size = 2          # hybrid only: Ulysses inside groups of this size
//! ep_size = 1                # expert parallel: 1 (the model is dense)
//! device = "cpu"             # or "npu" (a build with --features npu): npu:0, or under
//!                            # `cannon launch` one NPU per process (LOCAL_RANK), HCCL between
//!
//! [checkpoint]
//! # dir = "runs/x/checkpoints"
//! every = 0                  # steps between checkpoints, 0: none
//! keep_last = 2
//! resume = false             # true: the newest checkpoint in `dir`; or a checkpoint's path
//!
//! [log]
//! # dir = "runs/x"           # the run's output folder; absent: runs/<date>-<time>
//! # jsonl = "runs/x/metrics.jsonl"
//! every = 1
//! tensorboard = false        # true: the metrics as TensorBoard scalars in <dir>/tensorboard
//! ```
//!
//! Unknown sections and keys are errors that name them (serde `deny_unknown_fields`), and so
//! is every value out of its range ([`TrainConfig::validate`]: `train.lr = -1: must be > 0`).
//! `--set section.key=value` overrides go through the same parsing and the same checks
//! ([`TrainConfig::load`]).

mod parse;
mod paths;
pub mod preset;
mod validate;

pub use paths::{
    cache_dir, default_tokenizer, is_shared_tokenizer, shared_candidates, SHARED_TOKENIZER,
};

use crate::model::Precision;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// A configuration that cannot be used. Every variant names the file or the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("--set {arg}: {reason}")]
    Override { arg: String, reason: String },
    #[error("{key} = {value}: {reason}")]
    Invalid {
        key: &'static str,
        value: String,
        reason: String,
    },
}

/// `[model]`: what model, from which weights, and what of it trains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSection {
    /// A built-in preset name ([`preset::PRESETS`]) or an HF model directory holding
    /// `config.json` (write `./tiny` for a directory that shares a preset's name).
    pub config: String,
    /// Directory of safetensors weights (single or sharded, f32 or bf16); absent: random
    /// initialisation from `seed`.
    pub weights: Option<PathBuf>,
    /// Seed of the random initialisation.
    pub seed: u64,
    /// Parts that do not train: any of "vision", "projector", "text". Absent: vision and
    /// projector for an HF model (the usual fine-tuning recipe), nothing for a preset (its
    /// weights are random, so every part has to learn).
    pub freeze: Option<Vec<FreezePart>>,
}

impl Default for ModelSection {
    fn default() -> Self {
        ModelSection {
            config: "tiny".into(),
            weights: None,
            seed: 0,
            freeze: None,
        }
    }
}

/// A part of the model that can be frozen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FreezePart {
    Vision,
    Projector,
    Text,
}

impl From<FreezePart> for crate::model::Part {
    fn from(p: FreezePart) -> Self {
        match p {
            FreezePart::Vision => crate::model::Part::Vision,
            FreezePart::Projector => crate::model::Part::Projector,
            FreezePart::Text => crate::model::Part::Text,
        }
    }
}

/// `[data]`: what is read and how samples are shaped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataSection {
    /// Training set: a JSONL or JSON array file of conversations with images, or the name of
    /// an entry of `dataset_dir/dataset_info.json`; absent: the synthetic shapes set, made in
    /// the cache folder on first use.
    pub dataset: Option<PathBuf>,
    /// LLaMA-Factory's `dataset_dir`: where `dataset_info.json` is looked for and what image
    /// paths are relative to (absent: the dataset file's folder).
    pub dataset_dir: Option<PathBuf>,
    /// Held-out set the final evaluation scores; absent: the synthetic set's `heldout.jsonl`
    /// when training on the default, no evaluation otherwise.
    pub eval_dataset: Option<PathBuf>,
    /// The fraction of the training set held out as the held-out set instead (LLaMA-Factory's
    /// `val_size`): drawn with `train.seed`, never trained on; 0: none. Not with
    /// `eval_dataset`.
    pub eval_split: f64,
    /// `tekken.json`; absent: the model folder's `tekken.json` (the project's
    /// `../shared/tokenizers/tekken_240911.json` for a preset, or for a folder without one).
    pub tokenizer: Option<PathBuf>,
    /// The tokenizer's vocabulary cut to this many ids; absent: the model's `vocab_size` (the
    /// tokenizer's own when it is smaller; 1280 for a preset).
    pub vocab_size: Option<u32>,
    /// Longest sample (and packed row) in tokens.
    pub max_len: usize,
    /// Pack several samples per row instead of one padded sample per row.
    pub packing: bool,
    /// Images are resized so that their longest edge is at most this many pixels; absent: the
    /// model's `vision_config.image_size` (112 for a preset).
    pub longest_edge: Option<u32>,
    /// LLaMA-Factory's `image_max_pixels`: a larger image is first shrunk to about this many
    /// pixels (nearest neighbour), before the processor (MindSpeed-MM's Magistral: 262144).
    pub image_max_pixels: Option<u64>,
    /// LLaMA-Factory's `image_min_pixels`: a smaller image is first enlarged likewise (1024).
    pub image_min_pixels: Option<u64>,
    /// Samples of the synthetic set made for the default run (one in ten held out).
    pub synth_samples: usize,
    /// System prompt for samples that bring none: `"model"` reads the model folder's
    /// `SYSTEM_PROMPT.txt` (Magistral's default prompt), anything else is the prompt itself.
    #[serde(alias = "system_prompt")]
    pub system: Option<String>,
    /// Train the prompts too (LLaMA-Factory `train_on_prompt`).
    pub train_on_prompt: bool,
    /// Train only the last answer of a conversation (LLaMA-Factory `mask_history`).
    pub mask_history: bool,
    /// Where the index of a read dataset (token ids, labels, image sizes per sample) is kept,
    /// one file per dataset, tokenizer and data settings, written by the first process of a
    /// node to read the set and read by the others and by later runs (LLaMA-Factory's and
    /// MindSpeed-MM's `cache_dir`); absent: `index` in the cache folder ([`cache_dir`]).
    pub cache_dir: Option<PathBuf>,
}

impl Default for DataSection {
    fn default() -> Self {
        DataSection {
            dataset: None,
            dataset_dir: None,
            eval_dataset: None,
            eval_split: 0.0,
            tokenizer: None,
            vocab_size: None,
            max_len: 512,
            packing: false,
            longest_edge: None,
            image_max_pixels: None,
            image_min_pixels: None,
            synth_samples: 40_000,
            system: None,
            train_on_prompt: false,
            mask_history: false,
            cache_dir: None,
        }
    }
}

impl DataSection {
    /// Which tokens are trained (`train_on_prompt`, `mask_history`).
    pub fn labels(&self) -> crate::train::data::truncate::LabelPolicy {
        crate::train::data::truncate::LabelPolicy {
            train_on_prompt: self.train_on_prompt,
            mask_history: self.mask_history,
        }
    }
}

/// The learning-rate schedule after warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// Half a cosine from `lr` down to `min_lr` at the last step.
    Cosine,
    /// `lr` throughout.
    Constant,
}

/// `[train] dtype` as TOML spells it (`"f32"` or `"bf16"`): the [`Precision`] of the run.
mod precision_name {
    use super::Precision;
    use serde::{de, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(p: &Precision, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(p.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Precision, D::Error> {
        let name = String::deserialize(d)?;
        name.parse()
            .map_err(|_| de::Error::unknown_variant(&name, &Precision::NAMES))
    }
}

/// `[train]`: the optimisation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainSection {
    /// Rows per forward/backward pass.
    pub micro_batch: usize,
    /// Micro batches per optimizer step (the loss is normalised over all their targets).
    pub grad_accum: usize,
    /// Optimizer steps; exactly one of `steps` and `epochs` is given.
    pub steps: Option<usize>,
    /// Passes over the training set, converted to steps once its size is known.
    pub epochs: Option<f64>,
    /// Peak learning rate.
    pub lr: f64,
    pub schedule: Schedule,
    /// Steps of linear warm-up from `lr / warmup_steps` to `lr`.
    pub warmup_steps: usize,
    /// Learning rate at the end of the cosine.
    pub min_lr: f64,
    pub weight_decay: f64,
    pub betas: [f64; 2],
    pub eps: f64,
    /// Global gradient norm clip; 0 measures the norm without clipping.
    pub max_grad_norm: f64,
    /// Steps whose loss or gradient norm is not finite are skipped (not applied); this many
    /// in a row stop the run with an error (0: the first one does).
    pub max_skipped_steps: usize,
    /// A checkpoint whose weights reach this magnitude is not written (the run has
    /// diverged; the previous checkpoint stays the latest). Any non-finite value is refused
    /// whatever the bound.
    pub max_abs_weight: f64,
    /// Seed of the data order.
    pub seed: u64,
    /// Precision of the activations: f32, or bf16 autocast (f32 master weights and
    /// gradients).
    #[serde(with = "precision_name")]
    pub dtype: Precision,
    /// Rows per forward pass of the evaluations.
    pub eval_batch: usize,
    /// Steps between validation losses over the held-out set (and one after the last step),
    /// logged as `eval_loss` records; 0: none (the final evaluation only).
    pub eval_every: usize,
    /// Steps `[first, last]` (1-based, inclusive) whose spans (layers, ops, collectives,
    /// copies, data) are written as a Chrome trace, `<log.dir>/trace.json`; absent: none.
    pub profile_steps: Option<[usize; 2]>,
    /// Tokens per chunk of the lm_head + cross-entropy (the `[T,V]` logits never exist
    /// whole: at most one `[N,V]` chunk at a time); 0: the full logits.
    pub loss_chunk: usize,
    /// What each decoder layer keeps for its backward (see `crate::model::saved`).
    pub recompute: RecomputeMode,
    /// Saved decoder activations go to a host pool after each layer's forward and come back
    /// before its backward.
    pub offload_activations: bool,
    /// The f32 master weights and AdamW moments live in a host pool; each layer group is
    /// copied to the device at its point of use in the passes (the next one ahead) and
    /// streamed through it for the update (`model::optim`).
    pub offload_optimizer: bool,
}

/// `train.recompute`: what a decoder layer's forward keeps for its backward.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecomputeMode {
    /// Everything (no recompute).
    #[default]
    None,
    /// Only the layer's input; the backward runs the layer's forward again first.
    Full,
    /// The attention output + lse and the GEMM outputs; the norms and the SwiGLU product
    /// are made again in the backward.
    Selective,
}

impl Default for TrainSection {
    fn default() -> Self {
        TrainSection {
            micro_batch: 64,
            grad_accum: 1,
            steps: None,
            epochs: None,
            // The default's rate: at 2e-3 (to 2e-4) "which image" was learnt late or not at
            // all, depending on the seed (docs/benchmarks.md, "Seeds, learning rate and bf16").
            lr: 1e-3,
            schedule: Schedule::Cosine,
            warmup_steps: 50,
            min_lr: 1e-4,
            weight_decay: 0.0,
            betas: [0.9, 0.95],
            eps: 1e-8,
            max_grad_norm: 1.0,
            max_skipped_steps: 5,
            max_abs_weight: 1e6,
            seed: 42,
            dtype: Precision::F32,
            eval_batch: 32,
            eval_every: 0,
            profile_steps: None,
            loss_chunk: 0,
            recompute: RecomputeMode::None,
            offload_activations: false,
            offload_optimizer: false,
        }
    }
}

/// Steps of the default run when neither `steps` nor `epochs` is given.
pub const DEFAULT_STEPS: usize = 2500;

/// `[parallel]`: ranks and sharding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ParallelSection {
    /// Ranks (CPU threads today, NPUs with HCCL later): every step's micro batches are split
    /// row-wise over them, so the global batch is the same for any count.
    pub nproc: usize,
    /// Shard parameters, gradients and optimizer state over the ranks (ZeRO-3).
    pub fsdp: bool,
    /// Where the model runs: the host, or an Ascend NPU (npu:0; in a job of `cannon launch`,
    /// this process's NPU `LOCAL_RANK`, the job's ranks joined by HCCL).
    pub device: DeviceKind,
    /// Context parallel ranks: consecutive groups of `cp_size` ranks split each sequence's
    /// tokens (world = dp x cp, `crate::parallel::cp`). 1: off.
    pub cp_size: usize,
    /// How attention sees the whole sequence under context parallelism.
    pub cp_algo: crate::parallel::cp::CpAlgo,
    /// Hybrid only: the Ulysses degree inside each ring rank (must divide `cp_size`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ulysses_size: Option<usize>,
    /// Expert parallelism: only 1 (Magistral-Small-2509 is dense, it has no experts).
    pub ep_size: usize,
}

impl ParallelSection {
    /// The context-parallel layout these keys give.
    pub fn cp(&self) -> crate::parallel::cp::CpSettings {
        crate::parallel::cp::CpSettings {
            size: self.cp_size,
            algo: self.cp_algo,
            ulysses_size: self.ulysses_size.unwrap_or(1),
        }
    }
}

impl Default for ParallelSection {
    fn default() -> Self {
        ParallelSection {
            nproc: 1,
            fsdp: true,
            device: DeviceKind::Cpu,
            cp_size: 1,
            cp_algo: crate::parallel::cp::CpAlgo::Ulysses,
            ulysses_size: None,
            ep_size: 1,
        }
    }
}

/// `parallel.device`; also the `--device` of `cannon verify` and `plan`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Cpu,
    Npu,
}

/// Which checkpoint a run resumes from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Resume {
    /// `false`: start fresh; `true`: the newest checkpoint in `checkpoint.dir`.
    Latest(bool),
    /// A checkpoint directory.
    Path(PathBuf),
}

impl<'de> Deserialize<'de> for Resume {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Resume;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("true, false or a checkpoint directory")
            }
            fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<Resume, E> {
                Ok(Resume::Latest(b))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Resume, E> {
                Ok(Resume::Path(PathBuf::from(s)))
            }
        }
        d.deserialize_any(V)
    }
}

/// `[checkpoint]`: saving and resuming.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointSection {
    /// Where checkpoints go; absent: `<log.dir>/checkpoints`.
    pub dir: Option<PathBuf>,
    /// Steps between checkpoints; 0 saves none.
    pub every: usize,
    /// Checkpoints kept (older ones are pruned); at least 1.
    pub keep_last: usize,
    pub resume: Resume,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        CheckpointSection {
            dir: None,
            every: 0,
            keep_last: 2,
            resume: Resume::Latest(false),
        }
    }
}

/// `[log]`: where the run's records go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSection {
    /// The run's output folder (config.toml, metrics, run_identity.json, checkpoints);
    /// absent: `runs/<UTC date>-<time>` under the working directory.
    pub dir: Option<PathBuf>,
    /// Per-step metrics; absent: `<dir>/metrics.jsonl`.
    pub jsonl: Option<PathBuf>,
    /// Steps between metric records (and plain log lines); the last step is always written.
    pub every: usize,
    /// Also write every metric record as TensorBoard scalars in `<dir>/tensorboard/`.
    pub tensorboard: bool,
}

impl Default for LogSection {
    fn default() -> Self {
        LogSection {
            dir: None,
            jsonl: None,
            every: 1,
            tensorboard: false,
        }
    }
}

/// The whole configuration of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    pub model: ModelSection,
    pub data: DataSection,
    pub train: TrainSection,
    pub parallel: ParallelSection,
    pub checkpoint: CheckpointSection,
    pub log: LogSection,
}

/// The sections, in file order.
pub const SECTIONS: [&str; 6] = ["model", "data", "train", "parallel", "checkpoint", "log"];

impl TrainConfig {
    /// The frozen parts: as configured, or the default of the model source.
    pub fn frozen(&self) -> Vec<crate::model::Part> {
        match &self.model.freeze {
            Some(list) => list.iter().map(|&p| p.into()).collect(),
            None if self.is_preset() => Vec::new(),
            None => vec![crate::model::Part::Vision, crate::model::Part::Projector],
        }
    }

    /// True when `model.config` names a built-in preset.
    pub fn is_preset(&self) -> bool {
        preset::sizes(&self.model.config).is_some()
    }
}
