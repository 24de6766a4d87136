//! What `cannon plan` plans for: the HF config, the run config's keys (`--set`, checked as
//! `cannon train` checks them), including the memory-feature keys (all of which the trainer
//! runs, except `parallel.ep_size`, the planner's alone):
//!
//! ```text
//! parallel.cp_size = 1            context-parallel ranks of the language model (divides nproc)
//! parallel.cp_algo = "ulysses"    or "ring" | "hybrid" (Ulysses inside groups of
//! parallel.ulysses_size = 1       ulysses_size, Ring across them)
//! parallel.ep_size = 1            expert parallel: > 1 is an error (the model is dense)
//! train.recompute = "none"        or "full" | "selective"
//! train.loss_chunk = 0            rows of logits per chunk of the loss (0: the full loss)
//! train.offload_activations = false
//! train.offload_optimizer = false
//! ```
//!
//! A key the run config knows goes through its parsing too; a planner key the run config
//! does not know yet is taken by the planner alone.

use crate::model::memory::{ContextParallel, CpAlgo, StepFeatures};
use crate::model::Recompute;
use crate::model::{LossMode, Mistral3Config, Part, Precision};
use crate::train::config::{ConfigError, TrainConfig};
use cannon_runtime::Device;
use std::path::{Path, PathBuf};

/// Input `cannon plan` cannot use. Every variant names the path or the key.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("--config {path}: {reason}")]
    Model { path: PathBuf, reason: String },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{key} = {value}: {reason}")]
    Invalid {
        key: &'static str,
        value: String,
        reason: String,
    },
    #[error("{path}: {reason}")]
    Io { path: PathBuf, reason: String },
}

/// The keys the planner reads itself.
pub const PLANNER_KEYS: [&str; 8] = [
    "parallel.cp_size",
    "parallel.cp_algo",
    "parallel.ulysses_size",
    "parallel.ep_size",
    "train.recompute",
    "train.loss_chunk",
    "train.offload_activations",
    "train.offload_optimizer",
];

/// Everything a plan depends on.
#[derive(Clone, Debug)]
pub struct PlanSettings {
    /// The HF config directory.
    pub dir: PathBuf,
    pub model: Mistral3Config,
    /// Rows per optimizer micro batch, over all data-parallel ranks (`train.micro_batch`).
    pub micro_batch: usize,
    pub grad_accum: usize,
    pub max_len: usize,
    pub longest_edge: u32,
    pub images_per_row: usize,
    pub precision: Precision,
    pub nproc: usize,
    pub fsdp: bool,
    pub frozen: Vec<Part>,
    pub loss: LossMode,
    pub features: StepFeatures,
    pub offload_optimizer: bool,
    /// The device the ranks run on: what it saves for the attention's backward differs
    /// (`StepShape::lse_per_head`). [`PlanSettings::load`] plans for the CPU, the device of
    /// `cannon train`'s ranks by default; `cannon plan --device` picks another.
    pub device: Device,
}

impl PlanSettings {
    /// Reads `dir/config.json` and applies the `--set section.key=value` overrides.
    pub fn load(dir: &Path, sets: &[String], images_per_row: usize) -> Result<Self, PlanError> {
        let model_err = |reason: String| PlanError::Model {
            path: dir.to_path_buf(),
            reason,
        };
        if !dir.is_dir() {
            return Err(model_err(
                "not a directory (an HF model directory holding config.json)".into(),
            ));
        }
        let json = dir.join("config.json");
        if !json.is_file() {
            return Err(model_err(format!("{} is missing", json.display())));
        }
        let model = Mistral3Config::from_file(&json).map_err(|e| model_err(e.to_string()))?;

        let mut own = Vec::new();
        let mut run = vec![format!("model.config={}", dir.display())];
        for arg in sets {
            let key = arg.split_once('=').map_or(arg.as_str(), |k| k.0).trim();
            match PLANNER_KEYS.iter().find(|&&k| k == key) {
                Some(&k) => {
                    let value = arg.split_once('=').map_or("", |v| v.1).trim().to_string();
                    // The run config parses it too once it knows the key.
                    if knows(arg) {
                        run.push(arg.clone());
                    }
                    own.push((k, value));
                }
                None => run.push(arg.clone()),
            }
        }
        let cfg = TrainConfig::load(None, &run)?;
        let model_edge = model.vision_config.image_size as u32;
        let mut s = PlanSettings {
            dir: dir.to_path_buf(),
            model,
            micro_batch: cfg.train.micro_batch,
            grad_accum: cfg.train.grad_accum,
            max_len: cfg.data.max_len,
            // As a run of this folder would: the model's own image size unless set.
            longest_edge: cfg.data.longest_edge.unwrap_or(model_edge),
            images_per_row,
            precision: cfg.train.dtype,
            nproc: cfg.parallel.nproc,
            fsdp: cfg.parallel.fsdp,
            frozen: cfg.frozen(),
            loss: LossMode::Full,
            features: StepFeatures::default(),
            offload_optimizer: false,
            device: Device::Cpu,
        };
        for (key, value) in own {
            s.apply(key, &value)?;
        }
        s.check()?;
        Ok(s)
    }

    /// Applies one planner key.
    pub fn apply(&mut self, key: &'static str, value: &str) -> Result<(), PlanError> {
        let v = value.trim().trim_matches('"');
        let bad = |reason: &str| PlanError::Invalid {
            key,
            value: value.to_string(),
            reason: reason.to_string(),
        };
        let count = || {
            v.parse::<usize>()
                .map_err(|_| bad("must be a whole number >= 0"))
        };
        let flag = || v.parse::<bool>().map_err(|_| bad("must be true or false"));
        match key {
            "parallel.cp_size" => self.features.cp.size = count()?,
            "parallel.ulysses_size" => self.features.cp.ulysses = count()?,
            "parallel.cp_algo" => {
                self.features.cp.algo = match v {
                    "ulysses" => CpAlgo::Ulysses,
                    "ring" => CpAlgo::Ring,
                    "hybrid" => CpAlgo::Hybrid,
                    _ => return Err(bad("must be ulysses, ring or hybrid")),
                }
            }
            "parallel.ep_size" => {
                if count()? > 1 {
                    return Err(bad(
                        "expert parallel does not apply: Mistral3 (Magistral-Small-2509) is a \
                         dense model with no experts (use 1)",
                    ));
                }
            }
            "train.recompute" => {
                self.features.recompute = match v {
                    "none" => Recompute::None,
                    "full" => Recompute::Full,
                    "selective" => Recompute::Selective,
                    _ => return Err(bad("must be none, full or selective")),
                }
            }
            "train.loss_chunk" => {
                self.loss = match count()? {
                    0 => LossMode::Full,
                    c => LossMode::Chunked(c),
                }
            }
            "train.offload_activations" => self.features.offload_activations = flag()?,
            "train.offload_optimizer" => self.offload_optimizer = flag()?,
            _ => return Err(bad("not a planner key")),
        }
        Ok(())
    }

    /// Combinations the plan cannot describe, each naming the key.
    pub fn check(&self) -> Result<(), PlanError> {
        let bad = |key, value: usize, reason: String| PlanError::Invalid {
            key,
            value: value.to_string(),
            reason,
        };
        let cp = self.features.cp;
        if cp.size == 0 {
            return Err(bad("parallel.cp_size", 0, "must be > 0".into()));
        }
        if !self.nproc.is_multiple_of(cp.size) {
            return Err(bad(
                "parallel.cp_size",
                cp.size,
                format!(
                    "must divide parallel.nproc ({}): world = dp x cp",
                    self.nproc
                ),
            ));
        }
        if cp.size > 1 && self.micro_batch < self.nproc / cp.size {
            return Err(bad(
                "train.micro_batch",
                self.micro_batch,
                format!(
                    "must give every one of the {} data-parallel groups a row",
                    self.nproc / cp.size
                ),
            ));
        }
        if cp.algo == CpAlgo::Hybrid && cp.size > 1 {
            let u = cp.ulysses;
            if u < 2 || u >= cp.size || !cp.size.is_multiple_of(u) {
                return Err(bad(
                    "parallel.ulysses_size",
                    u,
                    format!(
                        "a hybrid needs 1 < ulysses_size < cp_size ({}) dividing it",
                        cp.size
                    ),
                ));
            }
        }
        let heads = self.model.text_config.num_attention_heads;
        let (u, _) = match cp.algo {
            CpAlgo::Ulysses => (cp.size, 1),
            CpAlgo::Ring => (1, cp.size),
            CpAlgo::Hybrid => (cp.ulysses, 1),
        };
        if cp.size > 1 && u > 1 && !heads.is_multiple_of(u) {
            return Err(bad(
                "parallel.cp_size",
                u,
                format!("Ulysses splits the {heads} attention heads: it must divide them"),
            ));
        }
        Ok(())
    }

    /// A copy with `ContextParallel` set (for the feature table), keeping the rows of each
    /// data-parallel group: with dp = nproc / cp groups, `micro_batch` becomes the rows per
    /// group times dp, so a rank holds 1/cp of its group's tokens (the seed's setting: micro
    /// batch 1 per group, the sequence split over the CP ranks).
    pub fn with_cp(&self, size: usize, algo: CpAlgo, ulysses: usize) -> Self {
        let mut s = self.clone();
        let (dp_was, dp) = (
            (self.nproc / self.features.cp.size.max(1)).max(1),
            (self.nproc / size.max(1)).max(1),
        );
        s.micro_batch = (self.micro_batch.div_ceil(dp_was) * dp).max(1);
        s.features.cp = ContextParallel {
            size,
            algo,
            ulysses,
        };
        s
    }
}

/// Whether the run config accepts `arg` as a key (a planner key it learnt since).
fn knows(arg: &str) -> bool {
    match TrainConfig::load(None, &[arg.to_string()]) {
        Ok(_) => true,
        Err(e) => !e.to_string().contains("unknown key"),
    }
}
