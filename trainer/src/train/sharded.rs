//! The one training loop of `cannon train`, for every world size: one process alone
//! ([`Ranks::Solo`], a world of one on the CPU or one NPU, whose shards are the whole groups);
//! `parallel.nproc = N > 1` in-process CPU ranks of an FSDP (ZeRO-3) run ([`crate::parallel::fsdp`]),
//! one thread and one caching allocator each; or, with `parallel.device = npu` in a job of
//! `cannon launch` ([`Ranks::Hccl`]), this process's one rank on its NPU, the job's ranks
//! joined by HCCL. Every step is [`FsdpRank::step`]. Rank 0's process alone writes the run's
//! files (config, identity, metrics, final model, evaluation), and the other processes train
//! their shards and leave.
//!
//! ```text
//! driver   RunSetup::new (data, tokenizer, model config, where the weights come from, GEMM
//!          peak): no model
//! rank r   its shards read or drawn from the setup's source (FsdpRank::new with
//!          RunSetup::source: random init per element, an HF checkpoint's byte ranges, or a
//!          resumed checkpoint's slices of the weights and moments); its own loader at the run's position (the same stream on every rank): per step
//!          the grad_accum micro batches of the global batch, of which it reads only its
//!          rows' images (Loader::next_rows with fsdp::rank_rows over the dp = nproc /
//!          cp_size replicas: the cp ranks of a replica take the same rows and split their
//!          tokens, `crate::parallel::cp`); FsdpRank::step at the schedule's learning rate
//! rank 0   the metrics line and progress of every step (memory figures: rank 0's
//!          allocator; tokens, samples, FLOPs: the whole global batch)
//! eval     every `train.eval_every` steps (and after the last) the held-out loss, each rank
//!          its rows of every chunk with no gradient (eval::loss; on the synthetic default
//!          also the greedy accuracy per type), rank 0 logs an `eval_loss` record
//! ckpt     every `checkpoint.every` steps (and after the last) each rank writes its shards
//!          into the step's checkpoint, rank 0 commits it (`train::resume::save_sharded`);
//!          a resumed run (saved over any world size) reads each rank's slices from it
//! end      the final model streamed group by group (FsdpRank::write_hf: every rank gathers
//!          a group, rank 0 writes it, it is dropped), then the held-out set scored by the
//!          ranks on their shards, each its rows of every batch (eval::sharded; rank 0
//!          reports): no process reads the model back whole
//! ```
//!
//! The global batch does not depend on N, and neither does the loss normalisation (the step's
//! trained targets over every rank), so N ranks follow the one-rank loss curve up to the
//! order of f32 gradient sums.

use super::error::TrainError;
use super::flops::shape_flops;
use super::metrics::{EvalLossRecord, Progress, RunLog, StepRecord};
use super::run::{RunSummary, StepHook, CACHE_SLACK};
use super::setup::{Counters, RunSetup};
use super::{preempt, resume};
use crate::model::Precision;
use crate::model::{ActElem, DeviceCtx};
use crate::parallel::fsdp::{rank_rows, run_cpu_ranks, FsdpError, FsdpRank, FsdpSettings};
use crate::train::data::shuffle::Position;
use crate::train::data::{DataError, Loader};
use crate::train::eval::loss::validation_loss_on;
use crate::train::eval::sharded::evaluate_on;
use cannon_runtime::comm::Communicator;
use cannon_runtime::trace::{self, Cat};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// When the command started (`cannon`'s entry calls [`mark_start`]): the start-up figure a run
/// prints counts from it, so it covers the process's set-up as well as the ranks'.
static STARTED: OnceLock<Instant> = OnceLock::new();

/// Marks the start of the process for the start-up figure (first call wins).
pub fn mark_start() {
    STARTED.get_or_init(Instant::now);
}

/// How long a rank waits for its peers at a collective before the run fails (a rank that
/// errors drops its communicator, which fails the others at once; this bounds a hang).
const RANK_TIMEOUT: Duration = Duration::from_secs(600);

/// The ranks of a run.
pub enum Ranks {
    /// One process alone, on this exec's device (the CPU or one NPU): a world of one
    /// ([`Communicator::solo`]), run on the calling thread.
    Solo(DeviceCtx),
    /// This many in-process CPU ranks (threads).
    Cpu(usize),
    /// This process's rank of a multi-process job (one per NPU), on the communicator's device.
    Hccl(Communicator),
}

/// Trains `setup`'s run on `parallel.nproc` in-process CPU ranks (one: this thread alone)
/// from its step to the last, then writes the final model and evaluates it.
pub fn run_sharded(setup: &mut RunSetup) -> Result<RunSummary, TrainError> {
    let ranks = match setup.plan.cfg.parallel.nproc {
        0 | 1 => Ranks::Solo(DeviceCtx::cpu()),
        n => Ranks::Cpu(n),
    };
    run_sharded_on(setup, ranks, &mut [])
}

/// [`run_sharded`] on the given ranks, with `hooks` run on rank 0 after every step. With
/// [`Ranks::Hccl`] on a rank other than 0 the summary has no losses and no evaluation (rank
/// 0's process reports the run).
pub fn run_sharded_on(
    setup: &mut RunSetup,
    ranks: Ranks,
    hooks: &mut [&mut (dyn StepHook + Send)],
) -> Result<RunSummary, TrainError> {
    match setup.plan.cfg.train.dtype {
        Precision::F32 => run_as::<f32>(setup, ranks, hooks),
        Precision::Bf16 => run_as::<half::bf16>(setup, ranks, hooks),
    }
}

/// How a rank's part of the run ended.
enum RankEnd {
    /// Rank 0 after the last step.
    Lead(Box<Rank0>),
    /// Another rank after the last step.
    Other,
    /// Stopped by a signal after (step, signal), with the checkpoint it saved then.
    Preempted((usize, i32), Option<std::path::PathBuf>),
}

/// What rank 0 brings back.
struct Rank0 {
    losses: Vec<f64>,
    last: Option<StepRecord>,
    position: Position,
    checkpoint: Option<std::path::PathBuf>,
    eval: Option<crate::train::eval::EvalReport>,
}

fn run_as<A: ActElem>(
    setup: &mut RunSetup,
    ranks: Ranks,
    hooks: &mut [&mut (dyn StepHook + Send)],
) -> Result<RunSummary, TrainError> {
    let (world, lead) = match &ranks {
        Ranks::Solo(_) => (1, true),
        Ranks::Cpu(n) => (*n, true),
        Ranks::Hccl(c) => (c.world_size(), c.rank() == 0),
    };
    let settings = FsdpSettings {
        adamw: setup.adamw,
        max_grad_norm: setup.plan.cfg.train.max_grad_norm,
        frozen: setup.plan.frozen.clone(),
        loss_mode: setup.loss_mode,
        memory: setup.memory,
    };
    let (first, total) = (setup.at.step, setup.total_steps);
    // The run's files are the lead process's: ranks of other processes would race on them.
    let (log, final_dir) = if lead {
        setup.write_config()?;
        let tensorboard = setup.plan.tensorboard_dir();
        let jsonl = RunLog::open(&setup.plan.jsonl, first, tensorboard.as_deref())?;
        (
            Some((jsonl, Progress::new(total, first))),
            Some(setup.final_dir()?),
        )
    } else {
        (None, None)
    };
    let log = Mutex::new(log);
    let hooks = Mutex::new(hooks);
    let started = Instant::now();
    let t: &RunSetup = setup;
    let cfg = &t.cfg;
    let source = t.source();
    let data_cfg = t.plan.data_config(t.image.clone(), t.system.clone());
    let (accum, every) = (t.plan.cfg.train.grad_accum, t.plan.cfg.log.every);
    let cp = t.plan.cfg.parallel.cp();
    cp.check(
        cfg.text_config.num_attention_heads,
        cfg.text_config.num_key_value_heads,
    )?;
    let eval_data = t.eval_data()?;
    let traces = Mutex::new(Vec::<(usize, Vec<trace::Span>)>::new());

    let body = |comm: Communicator, exec: DeviceCtx| {
        let r = comm.rank();
        // An NPU rank's cache is bounded as the CPU ranks' are (`fsdp::cpu_rank_exec`):
        // its device then reserves about what the plan says, not every shape a step freed.
        if !exec.device().runs_inline() {
            exec.allocator()
                .bound_cache(cannon_runtime::alloc::DEVICE_RESERVE_SLACK);
        }
        let fail = |e: TrainError| FsdpError::Invalid(format!("rank {r}: {e}"));
        let mut loader =
            Loader::open(&data_cfg, &t.tok, t.at.position).map_err(|e| fail(e.into()))?;
        let rank = FsdpRank::new(comm, exec, cfg.clone(), source, settings.clone())?;
        // Context parallel: replicas of cp ranks take the same rows (world = dp x cp).
        let mut rank = rank.with_cp(cp)?;
        let (replica, replicas) = rank.data_parallel();
        let (mut losses, mut last, mut checkpoint) = (Vec::new(), None, None::<std::path::PathBuf>);
        let (mut samples, mut tokens) = (t.at.samples, t.at.tokens);
        let (mut skipped, mut in_a_row) = (t.at.skipped, 0usize);
        let max_skipped = t.plan.cfg.train.max_skipped_steps;
        let eval_every = t.plan.cfg.train.eval_every;
        let mut peak = t.peak.flops();
        let profile = t.plan.cfg.train.profile_steps;
        for step in first..total {
            if r == 0 && step == first && log.lock().is_ok_and(|l| l.is_some()) {
                // The time to a run's first step (weights read, shards in place), which a
                // large checkpoint makes long.
                let since = STARTED.get().copied().unwrap_or(started);
                eprintln!("start-up {:.2} s", since.elapsed().as_secs_f64());
            }
            if profile.is_some_and(|[a, _]| step + 1 == a) {
                trace::start(started, Some(rank.exec().stream()));
            }
            let step_span = trace::span_at("step", step + 1, Cat::Step);
            let t0 = Instant::now();
            // Only this replica's rows are read (their images decoded); the shapes of the
            // whole micro batches give the step's tokens, samples and FLOPs.
            let (mut mine, mut shapes) = (Vec::new(), Vec::with_capacity(accum));
            let data_span = trace::span("data", Cat::Data);
            for _ in 0..accum {
                // Every rank skips the undecodable samples any rank found in the batch.
                let agree = |flags: &mut [i64]| {
                    rank.all_reduce_sum_i64(flags)
                        .map_err(|e| DataError::Ranks(e.to_string()))
                };
                let (rows, shape) = loader
                    .next_rows(|n| rank_rows(n, replica, replicas), agree)
                    .map_err(|e| fail(e.into()))?;
                if rows.rows > 0 {
                    mine.push(rows);
                }
                shapes.push(shape);
            }
            drop(data_span);
            let data_ms = t0.elapsed().as_secs_f64() * 1e3;
            let lr = t.at.schedule.at(resume::applied(step, skipped));
            let st = rank.step::<A>(&mine, lr)?;
            let step_s = t0.elapsed().as_secs_f64();
            // Each rank's allocator is bounded as the one-rank loop bounds its own (see
            // `CACHE_SLACK`: the batches' many shapes would grow the cache).
            let reserved = rank.exec().allocator().stats().reserved;
            if reserved > CACHE_SLACK * st.memory.max_allocated.max(1 << 24) {
                give_back_cache(rank.exec())?;
            }
            if st.skipped {
                // Not applied on any rank (they decide from the same sums): the weights,
                // moments and schedule are as before it; the data it read is consumed.
                skipped += 1;
                in_a_row += 1;
                if in_a_row > max_skipped {
                    return Err(fail(TrainError::Input(format!(
                        "step {}: {in_a_row} step(s) in a row with a non-finite loss or \
                         gradient norm (loss {}, grad_norm {}): stopped, with the weights of \
                         the last applied step{}; lower train.lr or check the data \
                         (train.max_skipped_steps = {max_skipped})",
                        step + 1,
                        st.loss,
                        st.grad_norm,
                        match &checkpoint {
                            Some(d) => format!(" and the checkpoint {}", d.display()),
                            None => String::new(),
                        }
                    ))));
                }
            } else {
                in_a_row = 0;
                losses.push(st.loss);
            }
            let step_tokens: u64 = shapes.iter().map(|b| b.sample_tokens as u64).sum();
            samples += shapes.iter().map(|b| b.samples as u64).sum::<u64>();
            tokens += step_tokens;
            // One small collective after the step: a stop signal on any rank stops every
            // rank after this step (they agree on it here, each having finished the step),
            // and the worst rank's memory peaks are the step's.
            let mut after = [
                i64::from(preempt::requested().is_some()),
                st.memory.max_allocated as i64,
                st.memory.max_reserved as i64,
            ];
            rank.all_reduce_max_i64(&mut after)?;
            let stop = (after[0] > 0).then(|| preempt::requested().unwrap_or(libc::SIGTERM));
            let worst = (after[1] as usize, after[2] as usize);
            if resume::due(&t.plan, step + 1, total) || stop.is_some() {
                // The step's cached blocks are of the step's sizes, which the save's do not
                // reuse: given back first, the save peaks at its own figure (the plan's
                // phase), not at the step's cache plus its own.
                give_back_cache(rank.exec())?;
                let at = Counters {
                    schedule: t.at.schedule,
                    step: step + 1,
                    position: loader.position(),
                    samples,
                    tokens,
                    dropped_samples: t.at.dropped_samples,
                    skipped,
                };
                let dir = resume::save_sharded(&t.plan, &t.model_json, &rank, &at)
                    .map_err(|e| fail(e.into()))?;
                checkpoint = Some(dir);
            }
            // Validation: every rank on its rows, no gradient, the weights untouched.
            let validation = match &eval_data {
                Some(data) if eval_every > 0 && due(step + 1, eval_every, total) => {
                    let _span = trace::span("validation", Cat::Eval);
                    Some(validate::<A>(&mut rank, data, t, step + 1).map_err(fail)?)
                }
                _ => None,
            };
            // The step's span covers what every rank does for it: the step, the ranks'
            // agreement on stopping, its checkpoint and validation.
            drop(step_span);
            if profile.is_some_and(|[_, b]| step + 1 == b) || (step + 1 == total) {
                keep_trace(&traces, r, trace::finish());
            }
            let preempted = stop.map(|signal| (step + 1, signal));
            if r != 0 {
                if let Some(p) = preempted {
                    return Ok(RankEnd::Preempted(p, checkpoint));
                }
                continue;
            }
            let flops: f64 = shapes
                .iter()
                .map(|b| shape_flops(cfg, b, &t.trainable).total)
                .sum();
            if flops / step_s > peak {
                // The probe ran while the host was busy: the step itself shows the machine
                // does better, and MFU above 1 would say nothing.
                peak = flops / step_s;
                if let Ok(Some((_, progress))) = log.lock().as_deref() {
                    progress.println(&format!(
                        "note: step {} ran at {:.1} model GFLOP/s, above the GEMM peak probed \
                         at start-up ({:.1}): MFU divides by the step's rate from here",
                        step + 1,
                        peak / 1e9,
                        t.peak.gflops
                    ));
                }
            }
            const MIB: f64 = 1024.0 * 1024.0;
            let rec = StepRecord {
                step: step + 1,
                loss: st.loss,
                grad_norm: st.grad_norm,
                lr: if st.targets == 0 || st.skipped {
                    0.0
                } else {
                    lr
                },
                step_ms: step_s * 1e3,
                data_ms,
                tokens_per_s: step_tokens as f64 / step_s,
                mfu: flops / (step_s * peak),
                max_allocated_mib: st.memory.max_allocated as f64 / MIB,
                max_reserved_mib: st.memory.max_reserved as f64 / MIB,
                max_allocated_mib_worst_rank: worst.0 as f64 / MIB,
                max_reserved_mib_worst_rank: worst.1 as f64 / MIB,
                dropped_samples: t.at.dropped_samples,
                skipped_samples: loader.skipped_samples() as u64,
                samples,
                tokens,
                targets: st.targets,
                skipped: st.skipped,
                skipped_steps: skipped,
            };
            let mut guard = log
                .lock()
                .map_err(|_| fail(TrainError::Input("the metrics log was poisoned".into())))?;
            if let Some((jsonl, progress)) = &mut *guard {
                if rec.step.is_multiple_of(every) || rec.step == total {
                    jsonl.step(&rec).map_err(fail)?;
                }
                progress.update(&rec, rec.step - first);
            }
            if let (Some(v), Some((jsonl, progress))) = (&validation, &mut *guard) {
                progress.println(&v.line());
                jsonl.validation(v).map_err(fail)?;
            }
            drop(guard);
            let mut hooks = hooks
                .lock()
                .map_err(|_| fail(TrainError::Input("a step hook panicked".into())))?;
            for h in hooks.iter_mut() {
                h.after_step(&t.plan, &rec).map_err(fail)?;
            }
            last = Some(rec);
            if let Some(p) = preempted {
                return Ok(RankEnd::Preempted(p, checkpoint));
            }
        }
        // The final model, one group at a time; rank 0 (of the lead process) writes it,
        // with the step's cache given back first (as before a save).
        give_back_cache(rank.exec())?;
        let out = final_dir.as_deref().filter(|_| r == 0);
        rank.write_hf(out.map(|d| (d, &t.model_json)))?;
        // The held-out set, scored by the ranks together on their shards, each on its own
        // rows; every rank gets the report, rank 0 returns it.
        let eval = match &eval_data {
            Some(data) => Some(
                evaluate_on::<A>(
                    &mut rank,
                    data,
                    &t.tok,
                    &t.image,
                    t.plan.cfg.train.eval_batch,
                )
                .map_err(|e| fail(e.into()))?,
            ),
            None => None,
        };
        Ok(match r {
            0 => RankEnd::Lead(Box::new(Rank0 {
                losses,
                last,
                checkpoint,
                position: loader.position(),
                eval,
            })),
            _ => RankEnd::Other,
        })
    };
    // run_identity.json is digested beside the ranks' start-up (see `write_identity`).
    let (results, identity) = std::thread::scope(|sc| {
        let identity = lead.then(|| sc.spawn(|| t.write_identity()));
        let results = match ranks {
            Ranks::Solo(exec) => {
                body(Communicator::solo(exec.device(), RANK_TIMEOUT), exec).map(|r| vec![r])
            }
            Ranks::Cpu(_) => run_cpu_ranks(world, RANK_TIMEOUT, body),
            Ranks::Hccl(comm) => DeviceCtx::new(comm.device())
                .map_err(FsdpError::from)
                .and_then(|exec| body(comm, exec))
                .map(|r| vec![r]),
        }
        .map_err(|e| match world {
            1 => TrainError::Input(e.to_string()),
            _ => TrainError::Input(format!("sharded run ({world} ranks): {e}")),
        });
        let identity = identity.map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(TrainError::Input("digesting the inputs panicked".into())))
        });
        (results, identity)
    });
    let results = results?;
    identity.transpose()?;
    write_trace(setup, lead, traces.into_inner().unwrap_or_default())?;
    // Stopped by a signal: every rank saved the step's checkpoint; nothing else is written.
    if let Some(RankEnd::Preempted((step, signal), Some(checkpoint))) =
        results.iter().find(|e| matches!(e, RankEnd::Preempted(..)))
    {
        if let Ok(Some((_, progress))) = log.into_inner() {
            progress.finish();
        }
        return Err(TrainError::Preempted {
            step: *step,
            signal: *signal,
            checkpoint: checkpoint.clone(),
        });
    }
    let wall_s = started.elapsed().as_secs_f64();
    let Some((mut jsonl, progress)) = log
        .into_inner()
        .map_err(|_| TrainError::Input("the metrics log was poisoned".into()))?
    else {
        // A rank of another process than rank 0's: its shards are trained; rank 0 reports.
        setup.at.step = total;
        return Ok(RunSummary {
            steps: total - first,
            losses: Vec::new(),
            wall_s,
            eval: None,
            final_model: setup.plan.out_dir.clone(),
            last_checkpoint: None,
        });
    };
    let rank0 = results
        .into_iter()
        .find_map(|e| match e {
            RankEnd::Lead(r) => Some(*r),
            _ => None,
        })
        .ok_or_else(|| TrainError::Input("rank 0 returned nothing".into()))?;
    progress.finish();
    let at = &mut setup.at;
    at.step = total;
    at.position = rank0.position;
    if let Some(rec) = &rank0.last {
        at.samples = rec.samples;
        at.tokens = rec.tokens;
    }
    let final_model = final_dir.unwrap_or_else(|| setup.plan.out_dir.join("final"));
    if let Some(rep) = &rank0.eval {
        setup.log_eval(rep, &mut jsonl)?;
    }
    Ok(RunSummary {
        steps: total - first,
        losses: rank0.losses,
        wall_s,
        eval: rank0.eval,
        final_model,
        last_checkpoint: rank0.checkpoint,
    })
}

/// Adds rank `r`'s spans (if it recorded any) to the run's trace.
fn keep_trace(traces: &Mutex<Vec<(usize, Vec<trace::Span>)>>, r: usize, spans: Vec<trace::Span>) {
    if spans.is_empty() {
        return;
    }
    if let Ok(mut t) = traces.lock() {
        t.push((r, spans));
    }
}

/// Writes the profiled steps' spans as a Chrome trace: `trace.json` in the run folder from
/// the lead process (every in-process rank), `trace-rank<R>.json` from a launched job's
/// other processes (one rank each).
fn write_trace(
    setup: &RunSetup,
    lead: bool,
    mut traces: Vec<(usize, Vec<trace::Span>)>,
) -> Result<(), TrainError> {
    let Some(&(first, _)) = traces.first() else {
        return Ok(());
    };
    traces.sort_by_key(|&(r, _)| r);
    let dir = &setup.plan.out_dir;
    let path = match lead {
        true => dir.join("trace.json"),
        false => dir.join(format!("trace-rank{first}.json")),
    };
    std::fs::create_dir_all(dir)
        .and_then(|_| trace::write_chrome(&path, &traces))
        .map_err(|source| TrainError::Io {
            path: path.clone(),
            source,
        })?;
    if let Some([a, b]) = setup.plan.cfg.train.profile_steps {
        eprintln!(
            "trace of steps {a}..={b}: {} (open it in https://ui.perfetto.dev or chrome://tracing)",
            path.display()
        );
    }
    Ok(())
}

/// Whether step `done` (1-based) ends with a validation: every `every` steps and after the
/// last.
fn due(done: usize, every: usize, total: usize) -> bool {
    done.is_multiple_of(every) || done == total
}

/// The validation after step `done`: the held-out loss, and on the synthetic default its
/// greedy accuracy per question type too. Collective; every rank gets the record.
fn validate<A: ActElem>(
    rank: &mut FsdpRank,
    data: &crate::train::data::dataset::DataSet,
    t: &RunSetup,
    done: usize,
) -> Result<EvalLossRecord, TrainError> {
    let rows = t.plan.cfg.train.eval_batch;
    let started = Instant::now();
    let v = validation_loss_on::<A>(rank, data, &t.image, t.tok.pad_id(), rows)?;
    let accuracy = match t.plan.cfg.data.dataset {
        None => Some(evaluate_on::<A>(rank, data, &t.tok, &t.image, rows)?),
        Some(_) => None,
    };
    Ok(EvalLossRecord::new(
        done,
        &v,
        accuracy.as_ref(),
        started.elapsed(),
    ))
}

/// Gives the rank's cached blocks back to its device once its stream's work is done: blocks
/// allocated without a stream carry no fence, so only the finished stream makes them free.
fn give_back_cache(exec: &DeviceCtx) -> Result<(), FsdpError> {
    exec.stream().synchronize()?;
    exec.allocator().empty_cache();
    Ok(())
}
