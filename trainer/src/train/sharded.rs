//! `cannon train` with `parallel.nproc = N > 1`: the same run on N in-process CPU ranks of
//! an FSDP (ZeRO-3) run ([`crate::fsdp`]), one thread and one caching allocator each; or,
//! with `parallel.device = npu` in a job of `cannon launch` ([`Ranks::Hccl`]), this process's
//! one rank on its NPU, the job's ranks joined by HCCL. Then rank 0's process alone writes
//! the run's files (config, identity, metrics, final model, evaluation), and the other
//! processes train their shards and leave.
//!
//! ```text
//! driver   Trainer::new as for one rank (data, tokenizer, model init, GEMM peak); its full
//!          model is cut into the ranks' shards and released
//! rank r   its own loader at the run's position (the same stream on every rank): per step
//!          the grad_accum micro batches of the global batch, of which it reads only its
//!          rows' images (Loader::next_rows with fsdp::rank_rows over the dp = nproc /
//!          cp_size replicas: the cp ranks of a replica take the same rows and split their
//!          tokens, `crate::cp`); FsdpRank::step at the schedule's learning rate
//! rank 0   the metrics line and progress of every step (memory figures: rank 0's
//!          allocator; tokens, samples, FLOPs: the whole global batch)
//! ckpt     every `checkpoint.every` steps (and after the last) each rank writes its shards
//!          into the step's checkpoint, rank 0 commits it (`train::resume::save_sharded`);
//!          a resumed run (any world size: the driver's state was consolidated from the
//!          checkpoint) hands each rank its shard of the weights and moments
//! end      the full parameters gathered, the final model written and evaluated as for one
//!          rank
//! ```
//!
//! The global batch does not depend on N, and neither does the loss normalisation (the step's
//! trained targets over every rank), so N ranks follow the one-rank loss curve up to the
//! order of f32 gradient sums.

use super::flops::shape_flops;
use super::metrics::{JsonlWriter, Progress, StepRecord};
use super::resume;
use super::run::{RunSummary, TrainError, Trainer, CACHE_SLACK};
use crate::config::Dtype;
use crate::data::shuffle::Position;
use crate::data::Loader;
use crate::fsdp::{
    rank_rows, run_cpu_ranks, FsdpError, FsdpRank, FsdpSettings, GroupState, ShardState,
};
use crate::model::{Act, Exec, Params};
use cannon_runtime::comm::Communicator;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a rank waits for its peers at a collective before the run fails (a rank that
/// errors drops its communicator, which fails the others at once; this bounds a hang).
const RANK_TIMEOUT: Duration = Duration::from_secs(600);

/// The ranks of a sharded run.
pub enum Ranks {
    /// This many in-process CPU ranks (threads).
    Cpu(usize),
    /// This process's rank of a multi-process job (one per NPU), on the communicator's device.
    Hccl(Communicator),
}

/// Trains `trainer`'s run on `parallel.nproc` CPU ranks from its state's step to the last,
/// then writes the final model and evaluates it, as [`Trainer::run`] does for one rank.
pub fn run_sharded(trainer: &mut Trainer) -> Result<RunSummary, TrainError> {
    let world = trainer.plan.cfg.parallel.nproc;
    run_sharded_on(trainer, Ranks::Cpu(world))
}

/// [`run_sharded`] on the given ranks. With [`Ranks::Hccl`] on a rank other than 0 the
/// summary has no losses and no evaluation (rank 0's process reports the run).
pub fn run_sharded_on(trainer: &mut Trainer, ranks: Ranks) -> Result<RunSummary, TrainError> {
    match trainer.plan.cfg.train.dtype {
        Dtype::F32 => run_as::<f32>(trainer, ranks),
        Dtype::Bf16 => run_as::<half::bf16>(trainer, ranks),
    }
}

/// What rank 0 brings back.
struct Rank0 {
    losses: Vec<f64>,
    params: Params,
    last: Option<StepRecord>,
    position: Position,
}

fn run_as<A: Act>(trainer: &mut Trainer, ranks: Ranks) -> Result<RunSummary, TrainError> {
    let (world, lead) = match &ranks {
        Ranks::Cpu(n) => (*n, true),
        Ranks::Hccl(c) => (c.world_size(), c.rank() == 0),
    };
    // The ranks take their shards of the driver's model; the driver's full copy (and its
    // gradients and moments) are released while they train.
    let s = &mut trainer.state;
    let model_exec = s.model.exec.clone();
    let host = s.model.params.to_host(model_exec.stream())?;
    // A resumed run (`train::resume` restored the driver's state, consolidated from a
    // checkpoint of any world size): every rank also takes its shard of the AdamW moments.
    let resumed = (s.step > 0).then(|| -> Result<_, TrainError> {
        let st = model_exec.stream();
        let host = |ts: &[Option<crate::model::offload::Stored>]| {
            ts.iter()
                .map(|t| t.as_ref().map(|t| t.to_host(st)).transpose())
                .collect::<Result<Vec<_>, _>>()
                .map_err(crate::model::ModelError::from)
        };
        Ok((s.opt.step, host(&s.opt.m)?, host(&s.opt.v)?))
    });
    let resumed = resumed.transpose()?;
    s.model.params.data.clear();
    s.grads.data.clear();
    s.opt.m.clear();
    s.opt.v.clear();
    let settings = FsdpSettings {
        adamw: s.opt.cfg,
        max_grad_norm: trainer.plan.cfg.train.max_grad_norm,
        frozen: trainer.plan.frozen.clone(),
        loss_mode: s.model.loss_mode,
        memory: s.model.memory,
    };
    let (first, total) = (trainer.state.step, trainer.state.total_steps);
    // The run's files are the lead process's: ranks of other processes would race on them.
    let log = if lead {
        trainer.write_run_files()?;
        let appending = trainer.state.step > 0;
        let jsonl =
            JsonlWriter::open(&trainer.plan.jsonl, appending).map_err(|e| TrainError::Io {
                path: trainer.plan.jsonl.clone(),
                source: e,
            })?;
        Some((jsonl, Progress::new(total, first)))
    } else {
        None
    };
    let log = Mutex::new(log);
    let started = Instant::now();
    let t: &Trainer = trainer;
    let cfg = &t.state.model.cfg;
    let data_cfg = t.plan.data_config(t.image.clone());
    let (accum, every) = (t.plan.cfg.train.grad_accum, t.plan.cfg.log.every);
    let cp = t.plan.cfg.parallel.cp();
    cp.check(cfg)?;

    let body = |comm: Communicator, exec: Exec| {
        let r = comm.rank();
        let fail = |e: TrainError| FsdpError::Invalid(format!("rank {r}: {e}"));
        let mut loader =
            Loader::open(&data_cfg, &t.tok, t.state.position).map_err(|e| fail(e.into()))?;
        let rank = FsdpRank::new(comm, exec, cfg.clone(), &host, settings.clone())?;
        // Context parallel: replicas of cp ranks take the same rows (world = dp x cp).
        let mut rank = rank.with_cp(cp)?;
        let (replica, replicas) = rank.data_parallel();
        if let Some((adam_step, m, v)) = &resumed {
            rank.load_state(&resumed_shard(&rank, *adam_step, &host, m, v)?)?;
        }
        let (mut losses, mut last) = (Vec::new(), None);
        let (mut samples, mut tokens) = (t.state.samples, t.state.tokens);
        for step in first..total {
            let t0 = Instant::now();
            // Only this replica's rows are read (their images decoded); the shapes of the
            // whole micro batches give the step's tokens, samples and FLOPs.
            let (mut mine, mut shapes) = (Vec::new(), Vec::with_capacity(accum));
            for _ in 0..accum {
                let (rows, shape) = loader
                    .next_rows(|n| rank_rows(n, replica, replicas))
                    .map_err(|e| fail(e.into()))?;
                if rows.rows > 0 {
                    mine.push(rows);
                }
                shapes.push(shape);
            }
            let data_ms = t0.elapsed().as_secs_f64() * 1e3;
            let lr = t.state.schedule.at(step);
            let st = rank.step::<A>(&mine, lr)?;
            let step_s = t0.elapsed().as_secs_f64();
            // Each rank's allocator is bounded as the one-rank loop bounds its own (see
            // `Trainer::step`: the batches' many shapes would grow the cache).
            let alloc = rank.exec().allocator();
            if alloc.stats().reserved > CACHE_SLACK * st.memory.max_allocated.max(1 << 24) {
                alloc.empty_cache();
            }
            if !st.loss.is_finite() {
                return Err(fail(TrainError::Input(format!(
                    "step {}: the loss is {} (lower train.lr or check the data)",
                    step + 1,
                    st.loss
                ))));
            }
            losses.push(st.loss);
            let step_tokens: u64 = shapes.iter().map(|b| b.sample_tokens as u64).sum();
            samples += shapes.iter().map(|b| b.samples as u64).sum::<u64>();
            tokens += step_tokens;
            if resume::due(&t.plan, step + 1, total) {
                let at = resume::Counters {
                    schedule: t.state.schedule,
                    step: step + 1,
                    position: loader.position(),
                    samples,
                    tokens,
                    dropped_samples: t.state.dropped_samples,
                };
                resume::save_sharded(&t.plan, &t.model_json, &rank, &at)
                    .map_err(|e| fail(e.into()))?;
            }
            if r != 0 {
                continue;
            }
            let flops: f64 = shapes
                .iter()
                .map(|b| shape_flops(cfg, b, &t.state.trainable).total)
                .sum();
            const MIB: f64 = 1024.0 * 1024.0;
            let rec = StepRecord {
                step: step + 1,
                loss: st.loss,
                grad_norm: st.grad_norm,
                lr: if st.targets == 0 { 0.0 } else { lr },
                step_ms: step_s * 1e3,
                data_ms,
                tokens_per_s: step_tokens as f64 / step_s,
                mfu: flops / (step_s * t.gemm_peak),
                max_allocated_mib: st.memory.max_allocated as f64 / MIB,
                max_reserved_mib: st.memory.max_reserved as f64 / MIB,
                dropped_samples: t.state.dropped_samples,
                samples,
                tokens,
                targets: st.targets,
            };
            let mut guard = log
                .lock()
                .map_err(|_| fail(TrainError::Input("the metrics log was poisoned".into())))?;
            if let Some((jsonl, progress)) = &mut *guard {
                if rec.step.is_multiple_of(every) || rec.step == total {
                    jsonl.write(&rec).map_err(|e| {
                        fail(TrainError::Io {
                            path: t.plan.jsonl.clone(),
                            source: e,
                        })
                    })?;
                }
                progress.update(&rec, rec.step - first);
            }
            last = Some(rec);
        }
        let params = rank.gather_full_params()?;
        Ok((r == 0).then_some(Rank0 {
            losses,
            params,
            last,
            position: loader.position(),
        }))
    };
    let results = match ranks {
        Ranks::Cpu(_) => run_cpu_ranks(world, RANK_TIMEOUT, body),
        Ranks::Hccl(comm) => Exec::new(comm.device())
            .map_err(FsdpError::from)
            .and_then(|exec| body(comm, exec))
            .map(|r| vec![r]),
    }
    .map_err(|e| TrainError::Input(format!("sharded run ({world} ranks): {e}")))?;
    let wall_s = started.elapsed().as_secs_f64();
    let Some((mut jsonl, progress)) = log
        .into_inner()
        .map_err(|_| TrainError::Input("the metrics log was poisoned".into()))?
    else {
        // A rank of another process than rank 0's: its shards are trained; rank 0 reports.
        trainer.state.step = total;
        return Ok(RunSummary {
            steps: total - first,
            losses: Vec::new(),
            wall_s,
            eval: None,
            final_model: trainer.plan.out_dir.clone(),
        });
    };
    let rank0 = results
        .into_iter()
        .flatten()
        .next()
        .ok_or_else(|| TrainError::Input("rank 0 returned nothing".into()))?;
    progress.finish();

    let s = &mut trainer.state;
    // The gathered parameters live on rank 0's device; the driver's model (which writes the
    // final model and evaluates it) may be elsewhere (the host, for NPU ranks).
    let device = |t: &crate::model::offload::Stored| t.device_tensor().map(|t| t.device());
    s.model.params = if rank0.params.data.first().and_then(device) == Some(s.model.exec.device()) {
        rank0.params
    } else {
        let st = rank0_stream(&rank0.params)?;
        let host = rank0.params.to_host(&st)?;
        crate::model::Params::from_host(&s.model.exec, rank0.params.layout.clone(), &host)?
    };
    s.step = total;
    s.position = rank0.position;
    if let Some(rec) = &rank0.last {
        s.samples = rec.samples;
        s.tokens = rec.tokens;
    }
    let (final_model, eval) = trainer.finish::<A>(&trainer.state.model, &mut jsonl)?;
    Ok(RunSummary {
        steps: total - first,
        losses: rank0.losses,
        wall_s,
        eval,
        final_model,
    })
}

/// This rank's shard of a resumed run's full weights and moments (`m`, `v`: one entry per
/// group, Some for the trained ones), as [`FsdpRank::load_state`] takes it.
fn resumed_shard(
    rank: &FsdpRank,
    adam_step: u64,
    params: &[Vec<f32>],
    m: &[Option<Vec<f32>>],
    v: &[Option<Vec<f32>>],
) -> Result<ShardState, FsdpError> {
    let (r, cut) = (rank.rank(), rank.shard_layout());
    let groups = (0..params.len())
        .map(|g| {
            let part =
                |full: &Option<Vec<f32>>| full.as_ref().map(|f| cut.cut(g, r, f)).transpose();
            Ok(GroupState {
                params: cut.cut(g, r, &params[g])?,
                m: part(&m[g])?,
                v: part(&v[g])?,
            })
        })
        .collect::<Result<_, FsdpError>>()?;
    Ok(ShardState {
        rank: r,
        world: rank.world_size(),
        step: adam_step,
        groups,
    })
}

/// A stream on the device of `params` (for reading them back to the host).
fn rank0_stream(params: &Params) -> Result<cannon_runtime::Stream, TrainError> {
    let device = params
        .data
        .first()
        .and_then(|t| t.device_tensor().map(|t| t.device()))
        .unwrap_or(cannon_runtime::Device::Cpu);
    Ok(cannon_runtime::Stream::new(device).map_err(crate::model::ModelError::from)?)
}
