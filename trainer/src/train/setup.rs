//! A run made ready without its model: data read, tokenizer, the model's config, the
//! schedule, where the weights come from, the GEMM peak. The loop ([`super::sharded`])
//! hands it to its ranks (one alone, or N), each of which reads or draws only its own shards
//! ([`crate::parallel::fsdp::ShardSource`]): no process builds the whole model to cut it.

use super::error::{io, TrainError};
use super::flops::PeakProbe;
use super::identity::{digest_files_beside, RunIdentity};
use super::metrics::RunLog;
use super::resolve::{make_synth, steps_for_epochs, weight_files};
use super::resolve::{ModelSource, ResolvedRun, FINAL_RUN_CONFIG};
use super::samples::SampleSetup;
use super::schedule::LrSchedule;
use super::settings::memory_features;
use crate::model::init::{self, Init};
use crate::model::optim::AdamWConfig;
use crate::model::weights::HfWeights;
use crate::model::{
    DeviceCtx, LossMode, MemoryFeatures, Mistral3Config, ModelError, ParamLayout, Part,
};
use crate::parallel::fsdp::ShardSource;
use crate::train::config::{self, ConfigError};
use crate::train::data::dataset::{DataSet, SampleSettings};
use crate::train::data::image::ImageConfig;
use crate::train::data::info::DatasetSpec;
use crate::train::data::show;
use crate::train::data::shuffle::Position;
use crate::train::data::template::SpecialIds;
use crate::train::data::{Loader, Tekken};
use crate::train::eval::EvalReport;
use std::path::{Path, PathBuf};

/// Where a run stands after a step: what a checkpoint's progress record is made of.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Counters {
    pub schedule: LrSchedule,
    /// Optimizer steps done.
    pub step: usize,
    pub position: Position,
    pub samples: u64,
    pub tokens: u64,
    pub dropped_samples: u64,
    /// Steps skipped so far for a non-finite loss or gradient norm: the learning rate of a
    /// step follows the steps applied (`step - skipped`).
    pub skipped: u64,
}

/// Where the run's starting weights come from.
#[derive(Debug)]
pub enum Weights {
    /// Random initialisation.
    Random { seed: u64, init: Init },
    /// An HF checkpoint, opened (headers checked; data read by ranges).
    Hf(HfWeights),
}

/// A run ready to train but for its model (see the module docs).
pub struct RunSetup {
    pub plan: ResolvedRun,
    pub tok: Tekken,
    pub loader: Loader,
    pub image: ImageConfig,
    /// The system prompt for samples that bring none, as decided ([`SampleSetup::system`]).
    pub system: Option<String>,
    /// The model's config.
    pub cfg: Mistral3Config,
    /// The model's `config.json` contents (written beside the final weights).
    pub model_json: serde_json::Value,
    /// The GEMM peak at the run's precision, measured at start-up for MFU.
    pub peak: PeakProbe,
    /// `(role, path)` of the run's input files, digested into `run_identity.json`.
    pub inputs: Vec<(String, PathBuf)>,
    /// Where the run stands: step 0, or a resumed checkpoint's counters.
    pub at: Counters,
    /// Optimizer steps of the whole run.
    pub total_steps: usize,
    /// Parts that train.
    pub trainable: Vec<Part>,
    pub adamw: AdamWConfig,
    pub loss_mode: LossMode,
    pub memory: MemoryFeatures,
    /// The starting weights of a fresh run.
    pub weights: Weights,
    /// The checkpoint a resumed sharded run reads its slices from ([`super::resume`]).
    pub resume: Option<PathBuf>,
}

impl std::fmt::Debug for RunSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunSetup")
            .field("out_dir", &self.plan.out_dir)
            .field("step", &self.at.step)
            .field("total_steps", &self.total_steps)
            .finish()
    }
}

impl RunSetup {
    /// Makes the default synthetic set if needed, reads tokenizer and data, decides the model
    /// config and where its weights come from (an HF checkpoint's headers are checked here),
    /// measures the GEMM peak on `exec`'s device. Writes nothing in the run folder yet.
    pub fn new(plan: ResolvedRun, exec: &DeviceCtx) -> Result<Self, TrainError> {
        if let Some(s) = &plan.synth {
            eprintln!(
                "making the synthetic shapes set ({} samples) in {}",
                s.samples,
                s.dir.display()
            );
            make_synth(s)?;
        }
        let cfg = &plan.cfg;
        let SampleSetup {
            tok,
            mcfg,
            model_json,
            image,
            system,
            warnings,
            ..
        } = SampleSetup::new(&plan)?;
        for w in &warnings {
            eprintln!("WARNING: {w}");
        }
        // The CP layout against the model's heads, before any data or weights are read.
        cfg.parallel.cp().check(
            mcfg.text_config.num_attention_heads,
            mcfg.text_config.num_key_value_heads,
        )?;
        let data_cfg = plan.data_config(image.clone(), system.clone());
        let loader = Loader::open(&data_cfg, &tok, Position::default())?;
        if let Some(used) = loader.index() {
            eprintln!("dataset {}: {}", plan.dataset.display(), used.describe());
        }
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
        let weights = match (&cfg.model.weights, &plan.model) {
            (Some(dir), _) => Weights::Hf(HfWeights::open(dir, &layout).map_err(ModelError::from)?),
            (None, ModelSource::Preset(..)) => Weights::Random {
                seed: cfg.model.seed,
                init: Init::FanIn,
            },
            (None, ModelSource::Dir(_)) => Weights::Random {
                seed: cfg.model.seed,
                init: Init::Normal(init::INITIALIZER_RANGE),
            },
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
        let t = &cfg.train;
        let adamw = AdamWConfig {
            lr: t.lr,
            beta1: t.betas[0],
            beta2: t.betas[1],
            eps: t.eps,
            weight_decay: t.weight_decay,
        };
        let precision = t.dtype;
        // On operands of their own allocator: the run's memory figures are the model's.
        let probe = exec.with_private_allocator().map_err(ModelError::from)?;
        let peak = PeakProbe::measure(&probe, precision).map_err(ModelError::from)?;
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
        let at = Counters {
            schedule,
            step: 0,
            position: loader.position(),
            samples: 0,
            tokens: 0,
            dropped_samples: stats.dropped_truncated as u64,
            skipped: 0,
        };
        Ok(RunSetup {
            plan,
            tok,
            loader,
            image,
            system,
            cfg: mcfg,
            model_json,
            peak,
            inputs,
            at,
            total_steps,
            trainable,
            adamw,
            loss_mode,
            memory,
            weights,
            resume: None,
        })
    }

    /// Where a rank's shards come from: the resumed checkpoint, else the starting weights.
    pub fn source(&self) -> ShardSource<'_> {
        match (&self.resume, &self.weights) {
            (Some(dir), _) => ShardSource::Checkpoint(dir),
            (None, Weights::Hf(w)) => ShardSource::Weights(w),
            (None, Weights::Random { seed, init }) => ShardSource::Random {
                seed: *seed,
                init: *init,
            },
        }
    }

    /// Moves the loader to the counters' position (after a checkpoint set them).
    pub fn restore_position(&mut self) {
        self.loader.seek(self.at.position);
    }

    /// Writes the run folder's `config.toml` (before the ranks start).
    pub(crate) fn write_config(&self) -> Result<PathBuf, TrainError> {
        let out = &self.plan.out_dir;
        std::fs::create_dir_all(out).map_err(io(out))?;
        let cfg_path = out.join("config.toml");
        let text = format!(
            "# The effective config of this run (every default and resolved path written in).\n{}",
            self.plan.effective().to_toml()
        );
        std::fs::write(&cfg_path, text).map_err(io(&cfg_path))?;
        Ok(cfg_path)
    }

    /// Digests the input files and the written `config.toml` at a low CPU priority
    /// ([`digest_files_beside`]) and writes `run_identity.json`. The loop runs it beside the
    /// ranks' start-up, which reads the same weight files: each is read from the disk once
    /// where the page cache holds it, and its hashing takes the CPU time the load leaves
    /// instead of a core the load wants.
    pub(crate) fn write_identity(&self) -> Result<(), TrainError> {
        let mut files = self.inputs.clone();
        files.push((
            "effective_config".into(),
            self.plan.out_dir.join("config.toml"),
        ));
        let mut id = RunIdentity::of_digests(digest_files_beside(&files)?);
        id.gemm_peak = Some(self.peak.clone());
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

    /// The folder the final model is written to, with the run's config copied in (each file
    /// replaced whole and fsynced: a crash never leaves one half written).
    pub(crate) fn final_dir(&self) -> Result<PathBuf, TrainError> {
        let dir = self.plan.out_dir.join("final");
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let fs = |e: crate::durable::FsError| TrainError::Io {
            path: e.path,
            source: e.source,
        };
        let cfg_copy = dir.join(FINAL_RUN_CONFIG);
        crate::durable::replace_file(&cfg_copy, self.plan.effective().to_toml().as_bytes())
            .map_err(fs)?;
        for (name, from) in self.plan.model_folder_files() {
            let bytes = std::fs::read(&from).map_err(io(&from))?;
            crate::durable::replace_file(&dir.join(name), &bytes).map_err(fs)?;
        }
        Ok(dir)
    }

    /// The held-out set, if the run has one (opened before training, so that a bad file
    /// stops the run before its steps are spent): `data.eval_dataset`, or the
    /// `data.eval_split` part of the training set the loader leaves out.
    pub(crate) fn eval_data(&self) -> Result<Option<DataSet>, TrainError> {
        let d = &self.plan.cfg.data;
        let (path, split) = match &self.plan.eval_dataset {
            Some(path) => (path, false),
            None if d.eval_split > 0.0 => (&self.plan.dataset, true),
            None => return Ok(None),
        };
        let spec = DatasetSpec::resolve(path, d.dataset_dir.as_deref())?;
        let settings = self.sample_settings();
        let (mut data, _) =
            DataSet::open_cached(&spec, &self.tok, &settings, &self.plan.cache_dir)?;
        if split {
            data = data.split_off_holdout(d.eval_split, self.plan.cfg.train.seed);
        }
        Ok(Some(data))
    }

    /// Writes the evaluation's record into the run's metrics (and its scalars, at the run's
    /// last step, into its TensorBoard file).
    pub(crate) fn log_eval(&self, rep: &EvalReport, log: &mut RunLog) -> Result<(), TrainError> {
        log.eval(self.total_steps, rep)
    }

    /// The run's first sample as `cannon data show` prints it (None: an empty set).
    pub fn first_sample(&self) -> Result<Option<String>, TrainError> {
        let Some(p) = self.loader.dataset().samples.first() else {
            return Ok(None);
        };
        let ids = SpecialIds::from_tekken(&self.tok)?;
        let text = show::render(&self.tok, ids.image, &p.input_ids, &p.labels)?;
        Ok(Some(format!(
            "first sample ({}:{}): {} (trained between \u{ab} and \u{bb})\n{text}",
            self.plan.dataset.display(),
            p.line,
            show::summary(p, ids.image)
        )))
    }

    fn sample_settings(&self) -> SampleSettings<'_> {
        SampleSettings {
            max_len: self.plan.cfg.data.max_len,
            system_prompt: self.system.as_deref(),
            image: &self.image,
            labels: self.plan.cfg.data.labels(),
        }
    }
}
