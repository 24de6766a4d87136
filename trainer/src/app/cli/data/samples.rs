//! How `cannon data check` and `cannon data show` decide what a sample is made with: as a run
//! would (`--config` and/or `--model`: the run's tokenizer, vocabulary, images and system
//! prompt, from the preset or the model folder), or from a tokenizer alone (its own vocabulary,
//! the image settings of its `image` section, else Mistral3's processor).

use crate::train::config::{self, TrainConfig};
use crate::train::data::dataset::SampleSettings;
use crate::train::data::image::ImageConfig;
use crate::train::data::info::DatasetSpec;
use crate::train::data::truncate::LabelPolicy;
use crate::train::data::Tekken;
use crate::train::resolve::{ResolvedRun, SYSTEM_FROM_MODEL};
use crate::train::samples::SampleSetup;
use crate::train::TrainError;
use std::path::PathBuf;

/// The cut-off of the tokenizer-only mode (LLaMA-Factory's and MindSpeed-MM's Magistral
/// `cutoff_len`).
pub const TOKENIZER_ONLY_MAX_LEN: usize = 2048;

/// What a dataset is read with.
#[derive(clap::Args, Debug, Clone)]
pub struct SampleArgs {
    /// A JSONL or JSON array file, or the name of an entry of DATASET_DIR/dataset_info.json.
    #[arg(long)]
    pub dataset: PathBuf,
    /// LLaMA-Factory's dataset_dir: holds dataset_info.json; relative image paths start
    /// here (default: the dataset file's folder).
    #[arg(long)]
    pub dataset_dir: Option<PathBuf>,
    /// A run config (TOML): read samples as that run would.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override a key of the run config (`--set data.system=model`); repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// An HF model folder (config.json, and its tekken.json and SYSTEM_PROMPT.txt when it has
    /// them) or a preset: read samples as a run of that model would.
    #[arg(long)]
    pub model: Option<String>,
    /// tekken.json (default: the model folder's; without --model and --config, the project's).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Truncate the vocabulary (mistral-common `Tekkenizer(vocab_size=)`).
    #[arg(long)]
    pub vocab_size: Option<u32>,
    /// Longest sample in tokens (default: the run config's; 2048 for a tokenizer alone).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_len: Option<u64>,
    /// Image longest edge after resizing (default: the model's, or the tokenizer's).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub longest_edge: Option<u32>,
    /// System prompt for samples that bring none; "model" reads the model folder's
    /// SYSTEM_PROMPT.txt.
    #[arg(long)]
    pub system: Option<String>,
}

/// The tokenizer and settings a dataset is read with.
#[derive(Debug)]
pub struct Samples {
    pub spec: DatasetSpec,
    pub tok: Tekken,
    pub image: ImageConfig,
    pub system: Option<String>,
    pub labels: LabelPolicy,
    pub max_len: usize,
    /// Deliberate departures from the model's own setup (see [`SampleSetup::warnings`]).
    pub warnings: Vec<String>,
}

impl Samples {
    pub fn settings(&self) -> SampleSettings<'_> {
        SampleSettings {
            max_len: self.max_len,
            system_prompt: self.system.as_deref(),
            image: &self.image,
            labels: self.labels,
        }
    }
}

fn quoted(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

impl SampleArgs {
    /// Reads the tokenizer and decides the settings (see the module docs).
    pub fn resolve(&self) -> Result<Samples, TrainError> {
        let as_run = self.config.is_some()
            || self.model.is_some()
            || self
                .sets
                .iter()
                .any(|s| s.trim_start().starts_with("model."));
        let mut sets = Vec::new();
        if !as_run {
            sets.push(format!("data.max_len={TOKENIZER_ONLY_MAX_LEN}"));
        }
        sets.extend(self.sets.iter().cloned());
        if let Some(m) = &self.model {
            sets.push(format!("model.config={}", quoted(m)));
        }
        if let Some(t) = &self.tokenizer {
            sets.push(format!("data.tokenizer={}", quoted(&t.to_string_lossy())));
        }
        if let Some(v) = self.vocab_size {
            sets.push(format!("data.vocab_size={v}"));
        }
        if let Some(v) = self.max_len {
            sets.push(format!("data.max_len={v}"));
        }
        if let Some(v) = self.longest_edge {
            sets.push(format!("data.longest_edge={v}"));
        }
        if let Some(s) = &self.system {
            sets.push(format!("data.system={}", quoted(s)));
        }
        let cfg = TrainConfig::load(self.config.as_deref(), &sets)?;
        let d = &cfg.data;
        let spec = DatasetSpec::resolve(&self.dataset, self.dataset_dir.as_deref())?;
        if as_run {
            let plan = ResolvedRun::resolve(cfg.clone(), self.config.as_deref())?;
            let s = SampleSetup::new(&plan)?;
            return Ok(Samples {
                spec,
                tok: s.tok,
                image: s.image,
                system: s.system,
                labels: s.labels,
                max_len: cfg.data.max_len,
                warnings: s.warnings,
            });
        }
        if d.system.as_deref() == Some(SYSTEM_FROM_MODEL) {
            return Err(TrainError::Input(format!(
                "--system {SYSTEM_FROM_MODEL} reads SYSTEM_PROMPT.txt from the model folder: \
                 give it with --model DIR"
            )));
        }
        let path = match &d.tokenizer {
            Some(p) => p.clone(),
            None => config::default_tokenizer()?,
        };
        let tok = Tekken::from_file(&path, d.vocab_size)?;
        // The project's tokenizer carries Pixtral-12B's image section (16 px patches, no
        // merge), which no Mistral3 follows: Mistral3's processor is used with it.
        let own = tok
            .image_config()
            .filter(|_| !config::is_shared_tokenizer(&path));
        let mut image = ImageConfig {
            max_pixels: d.image_max_pixels,
            min_pixels: d.image_min_pixels,
            ..ImageConfig::default()
        };
        if let Some(i) = own {
            image.patch_size = i.image_patch_size;
            image.merge_size = i.spatial_merge_size;
            image.longest_edge = i.max_image_size;
        }
        if let Some(e) = d.longest_edge {
            image.longest_edge = e;
        }
        Ok(Samples {
            spec,
            tok,
            image,
            system: d.system.clone(),
            labels: d.labels(),
            max_len: d.max_len,
            warnings: Vec::new(),
        })
    }
}
