//! A training run: a [`TrainConfig`](crate::config::TrainConfig) resolved into paths and a
//! model source ([`RunPlan`], [`super::run_plan`]), then data, tokenizer and model made ready
//! ([`Trainer::new`]) and trained ([`Trainer::run`]): micro batches from the [`Loader`],
//! gradient accumulation normalised over the step's targets, the LR schedule, clipping,
//! AdamW, per-step metrics, and the held-out evaluation at the end.
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
use super::run_plan::{image_config, make_synth, model_config, steps_for_epochs, weight_files};
use super::run_plan::{ModelSource, RunPlan, FINAL_RUN_CONFIG};
use super::schedule::LrSchedule;
use super::step::{accumulate, memory_features};
use crate::config::{self, ConfigError, Dtype};
use crate::data::dataset::DataSet;
use crate::data::image::ImageConfig;
use crate::data::info::DatasetSpec;
use crate::data::shuffle::Position;
use crate::data::{DataError, Loader, Tekken};
use crate::eval::{self, EvalError, EvalReport};
use crate::model::init::{self, Init};
use crate::model::optim::{clip_grad_norm, AdamW, AdamWConfig};
use crate::model::{weights, Act, Exec, Grads, Mistral3, ModelError, ParamLayout, Part};
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

pub(super) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
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
