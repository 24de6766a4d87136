//! A one-process training run: a [`TrainConfig`](crate::config::TrainConfig) resolved into
//! paths and a model source ([`RunPlan`], [`super::run_plan`]), data and tokenizer made ready
//! ([`RunSetup`]), then the model built on it ([`Trainer::new`]) and trained
//! ([`Trainer::run`]): micro batches from the [`Loader`],
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

use super::flops::shape_flops;
use super::metrics::{JsonlWriter, Progress, StepRecord};
use super::run_plan::RunPlan;
use super::schedule::LrSchedule;
use super::setup::{RunSetup, Weights};
use super::step::accumulate;
use crate::config::{ConfigError, Dtype};
use crate::data::shuffle::Position;
use crate::data::DataError;
use crate::eval::{EvalError, EvalReport};
use crate::model::init;
use crate::model::optim::{clip_grad_norm, AdamW};
use crate::model::{Act, Exec, Grads, Mistral3, ModelError, ParamLayout, Params, Part};
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

/// A one-process run ready to train: its [`RunSetup`] and its model, state at step 0 (or
/// wherever a checkpoint put it).
pub struct Trainer {
    pub setup: RunSetup,
    pub state: TrainState,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("out_dir", &self.setup.plan.out_dir)
            .field("step", &self.state.step)
            .field("total_steps", &self.state.total_steps)
            .finish()
    }
}

impl Trainer {
    /// [`RunSetup::new`], then the model built on `exec` (HF weights or random init) with
    /// its gradients and optimizer. Writes nothing in the run folder yet.
    pub fn new(plan: RunPlan, exec: Exec) -> Result<Self, TrainError> {
        let setup = RunSetup::new(plan, &exec)?;
        Self::build(setup, exec)
    }

    /// The model of `setup`'s run on `exec`, whole in this process.
    pub fn build(setup: RunSetup, exec: Exec) -> Result<Self, TrainError> {
        let memory = setup.memory;
        let exec = match (memory.needs_host_pool(), exec.host_pool()) {
            (true, None) => exec.with_host_pool().map_err(ModelError::from)?,
            _ => exec,
        };
        let layout = ParamLayout::new(&setup.cfg);
        let mut params = match &setup.weights {
            Weights::Hf(w) => {
                let host = (0..layout.groups.len())
                    .map(|g| w.read(g, 0..layout.groups[g].len))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(ModelError::from)?;
                Params::from_host(&exec, layout, &host)?
            }
            Weights::Random { seed, init } => init::random_params(&exec, layout, *seed, *init)?,
        };
        if memory.offload_optimizer {
            // Into the host pool before the gradients and moments exist: start-up then holds
            // at most the f32 weights on the device, not weights, gradients and moments.
            params.offload(&exec)?;
            exec.allocator().empty_cache();
        }
        let model = Mistral3 {
            cfg: setup.cfg.clone(),
            params,
            loss_mode: setup.loss_mode,
            memory,
            exec: exec.clone(),
        };
        let grads = model.grads(&setup.trainable)?;
        // Under the optimizer offload the moments are made in the host pool.
        let opt = match memory.offload_optimizer {
            true => AdamW::new_in_host_pool(&exec, setup.adamw, &grads)?,
            false => AdamW::new(&exec, setup.adamw, &grads)?,
        };
        let at = setup.at;
        let state = TrainState {
            step: at.step,
            total_steps: setup.total_steps,
            schedule: at.schedule,
            position: at.position,
            samples: at.samples,
            tokens: at.tokens,
            dropped_samples: at.dropped_samples,
            model,
            opt,
            grads,
            trainable: setup.trainable.clone(),
        };
        Ok(Trainer { setup, state })
    }

    /// Moves the loader to the state's position (after a checkpoint overwrote the state).
    pub fn restore_position(&mut self) {
        self.setup.loader.seek(self.state.position);
    }

    /// Writes the run folder's `config.toml` and `run_identity.json`, trains from the
    /// state's step to the last, writes the final model, and evaluates on the held-out set.
    pub fn run(&mut self, hooks: &mut [&mut dyn StepHook]) -> Result<RunSummary, TrainError> {
        match self.setup.plan.cfg.train.dtype {
            Dtype::F32 => self.run_as::<f32>(hooks),
            Dtype::Bf16 => self.run_as::<half::bf16>(hooks),
        }
    }

    fn run_as<A: Act>(
        &mut self,
        hooks: &mut [&mut dyn StepHook],
    ) -> Result<RunSummary, TrainError> {
        self.setup.write_run_files()?;
        // A resumed state's weights and moments were restored where the checkpoint code put
        // them (into the host pool when the state was offloaded already; a state built
        // from a checkpoint elsewhere may be on the device): the offload is applied again.
        if self.state.model.memory.offload_optimizer {
            let exec = self.state.model.exec.clone();
            let s = &mut self.state;
            s.opt.offload(&exec, &mut s.model.params)?;
        }
        let resuming = self.state.step > 0;
        let jsonl_path = &self.setup.plan.jsonl;
        let mut jsonl = JsonlWriter::open(jsonl_path, resuming).map_err(io(jsonl_path))?;
        let started = Instant::now();
        let first = self.state.step;
        let total = self.state.total_steps;
        let mut progress = Progress::new(total, first);
        let mut losses = Vec::new();
        let every = self.setup.plan.cfg.log.every;
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
                jsonl.write(&r).map_err(io(&self.setup.plan.jsonl))?;
            }
            progress.update(&r, r.step - first);
            for h in hooks.iter_mut() {
                h.after_step(&self.setup.plan, &self.state)?;
            }
        }
        progress.finish();
        let wall_s = started.elapsed().as_secs_f64();
        let final_model = self.setup.final_dir()?;
        crate::model::save::save_hf(&self.state.model, &self.setup.model_json, &final_model)?;
        let eval = self.setup.evaluate::<A>(&self.state.model, &mut jsonl)?;
        Ok(RunSummary {
            steps: self.state.step - first,
            losses,
            wall_s,
            eval,
            final_model,
        })
    }

    /// One optimizer step: `grad_accum` micro batches, clip, AdamW at the schedule's rate.
    pub fn step<A: Act>(&mut self) -> Result<StepRecord, TrainError> {
        let t0 = Instant::now();
        let st_exec = self.state.model.exec.clone();
        let alloc = st_exec.allocator();
        alloc.reset_peak();
        let accum = self.setup.plan.cfg.train.grad_accum;
        let (mut micro, mut shapes) = (Vec::with_capacity(accum), Vec::with_capacity(accum));
        for _ in 0..accum {
            let (batch, shape) = self.setup.loader.next_rows(|rows| 0..rows)?;
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
            let g = clip_grad_norm(st, &mut s.grads, self.setup.plan.cfg.train.max_grad_norm)
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
        s.position = self.setup.loader.position();
        const MIB: f64 = 1024.0 * 1024.0;
        Ok(StepRecord {
            step: s.step,
            loss: acc.loss,
            grad_norm,
            lr,
            step_ms: step_s * 1e3,
            data_ms,
            tokens_per_s: tokens as f64 / step_s,
            mfu: flops / (step_s * self.setup.gemm_peak),
            max_allocated_mib: mem.peak_allocated as f64 / MIB,
            max_reserved_mib: mem.peak_reserved as f64 / MIB,
            dropped_samples: s.dropped_samples,
            skipped_samples: self.setup.loader.skipped_samples() as u64,
            samples: s.samples,
            tokens: s.tokens,
            targets: acc.targets,
        })
    }
}

/// How many times a step's peak allocation the allocator may keep reserved before the loop
/// releases its cache (see [`Trainer::step`]).
pub const CACHE_SLACK: usize = 4;
