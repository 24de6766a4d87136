//! `cannon train [--config FILE.toml] [--set section.key=value ...] [--dry-run]`: the
//! project's main job (see [`crate::train::run`] and [`crate::train::config`]).
//!
//! With no arguments it trains the built-in tiny Mistral3 on the synthetic shapes set on the
//! CPU and ends with the held-out accuracy per question type. Exit codes: 0 done (and, for the
//! built-in default, the accuracy bar met), 1 the default run finished below its accuracy
//! bar, 2 unusable config or input, or a failure during the run.
//!
//! `parallel.device = npu` runs the model on an NPU: npu:0 in a single process, or, in a job
//! of `cannon launch` (`WORLD_SIZE` > 1 in the environment), this process's NPU `LOCAL_RANK`
//! as one FSDP rank of the job, the ranks joined by HCCL (`crate::train::sharded`).

use crate::model::{weights, DeviceCtx, ParamLayout};
use crate::train::config::{DeviceKind, Resume, TrainConfig};
use crate::train::data::dataset::DataSet;
use crate::train::data::info::DatasetSpec;
use crate::train::resolve::{self, ModelSource, ResolvedRun};
use crate::train::samples::SampleSetup;
use crate::train::sharded::Ranks;
use crate::train::{resume, run_dir};
use crate::train::{RunSetup, TrainError};
use cannon_runtime::comm::Communicator;
use cannon_runtime::Device;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug, Clone)]
pub struct TrainArgs {
    /// TOML run config (sections model, data, train, parallel, checkpoint, log); without
    /// it, the built-in tiny default.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override one key: `--set train.lr=1e-3 --set data.packing=true` (checked like the file).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub sets: Vec<String>,
    /// Check config, data, tokenizer and weights, print the resolved config and the command,
    /// and exit without training.
    #[arg(long)]
    pub dry_run: bool,
    /// Start afresh in a log.dir that already holds a run: the old run is moved aside to
    /// `<log.dir>.old-<n>` (never deleted). Without it such a folder is refused unless the
    /// run resumes (checkpoint.resume).
    #[arg(long)]
    pub force: bool,
}

/// The command line as typed (less `--dry-run`: the command that trains), quoted for a POSIX
/// shell.
pub fn command_line() -> String {
    std::env::args()
        .filter(|a| a != "--dry-run")
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
            {
                a
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn run(args: TrainArgs) -> ExitCode {
    let cfg = match TrainConfig::load(args.config.as_deref(), &args.sets) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cannon train: {e}");
            return ExitCode::from(2);
        }
    };
    if cfg.checkpoint.resume == Resume::Latest(true)
        && cfg.log.dir.is_none()
        && cfg.checkpoint.dir.is_none()
    {
        eprintln!(
            "cannon train: checkpoint.resume = true looks for the newest checkpoint in \
             checkpoint.dir, and without log.dir or checkpoint.dir this run would get a new, \
             empty folder: set log.dir to the run folder to continue (or checkpoint.dir, or \
             checkpoint.resume = \"DIR\")"
        );
        return ExitCode::from(2);
    }
    let plan = match ResolvedRun::resolve(cfg, args.config.as_deref()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("cannon train: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = job_device(&plan) {
        eprintln!("cannon train: {e}");
        return ExitCode::from(2);
    }
    if args.dry_run {
        return match dry_run(&plan, args.force) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("cannon train --dry-run: {e}");
                ExitCode::from(2)
            }
        };
    }
    match train(plan, args.force) {
        Ok(code) => code,
        Err(e @ TrainError::Preempted { .. }) => {
            eprintln!("cannon train: {e}");
            ExitCode::from(crate::train::preempt::EXIT_PREEMPTED)
        }
        Err(e) => {
            eprintln!("cannon train: {e}");
            ExitCode::from(2)
        }
    }
}

fn print_config(plan: &ResolvedRun) {
    println!("# effective config");
    print!("{}", plan.effective().to_toml());
}

/// This process's rank in a launched job (`RANK`; 0 alone).
fn job_rank() -> usize {
    std::env::var("RANK")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The job's process count (`WORLD_SIZE`; 1 alone).
fn job_world() -> usize {
    std::env::var("WORLD_SIZE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(1)
}

/// Refuses a job of several processes off the NPU: only NPU ranks join one another (HCCL);
/// on the CPU each process would train the whole model alone, N runs into one run folder.
/// CPU ranks are threads of one process (`parallel.nproc`).
pub(super) fn job_device(plan: &ResolvedRun) -> Result<(), TrainError> {
    let world = job_world();
    if world > 1 && plan.cfg.parallel.device != DeviceKind::Npu {
        return Err(TrainError::Input(format!(
            "this process is one of a job of {world} (WORLD_SIZE = {world}) but parallel.device \
             = {}: processes of a job join one another only on the NPU (set parallel.device = \
             npu); on the CPU run one process with --set parallel.nproc={world} (in-process \
             ranks) instead of `cannon launch`",
            format!("{:?}", plan.cfg.parallel.device).to_lowercase()
        )));
    }
    Ok(())
}

fn train(plan: ResolvedRun, force: bool) -> Result<ExitCode, TrainError> {
    let default_run = plan.cfg.data.dataset.is_none() && plan.cfg.is_preset();
    // Rank 0 decides for the job's one run folder, before anything is written there (the
    // other ranks write only into the checkpoint rank 0 begins).
    if job_rank() == 0 {
        match run_dir::claim(&plan, force)? {
            run_dir::Claim::MovedAside(moved) => {
                for (from, to) in moved {
                    eprintln!(
                        "--force: the run in {} was moved aside to {}",
                        from.display(),
                        to.display()
                    );
                }
            }
            run_dir::Claim::Continue | run_dir::Claim::Fresh => {}
        }
    }
    print_config(&plan);
    println!("# command: {}", command_line());
    if cfg!(feature = "npu") {
        eprintln!("{}", super::doctor::cann_line());
    }
    // In a launched NPU job the ranks join first (a rank that fails to start must not leave
    // the others waiting on a model build); the driver's model stays on the host and each
    // rank takes its shards onto its NPU.
    let job = npu_job(&plan)?;
    let exec = match (plan.cfg.parallel.device, &job) {
        (DeviceKind::Npu, None) => {
            let device = Device::Npu(local_rank());
            eprintln!("device: {device}");
            DeviceCtx::new(device).map_err(|e| TrainError::Input(format!("{device}: {e}")))?
        }
        _ => DeviceCtx::cpu(),
    };
    let mut setup = RunSetup::new(plan, &exec)?;
    let ckpt = resume::resume_from(&setup.plan)?;
    if ckpt.is_none() && resolve::wants_resume(&setup.plan.cfg) {
        eprintln!(
            "no checkpoint in {} yet: starting at step 0",
            setup.plan.checkpoint_dir.display()
        );
    }
    let layout = ParamLayout::new(&setup.cfg);
    let trained: usize = layout
        .groups
        .iter()
        .filter(|g| setup.trainable.contains(&g.part))
        .map(|g| g.len)
        .sum();
    eprintln!(
        "model {:?}: {} parameters, {} trained ({:?}); {} samples ({} dropped by truncation, {} \
         bad lines); {} steps of {} x {} rows; GEMM peak {:.1} GFLOP/s ({})",
        match &setup.plan.model {
            ModelSource::Preset(n, _) => n.clone(),
            ModelSource::Dir(d) => d.display().to_string(),
        },
        layout.num_params(),
        trained,
        setup.trainable,
        setup.loader.stats().samples,
        setup.loader.stats().dropped_truncated,
        setup.loader.stats().bad_lines,
        setup.total_steps,
        setup.plan.cfg.train.grad_accum,
        setup.plan.cfg.train.micro_batch,
        setup.peak.gflops,
        setup.plan.cfg.train.dtype.name(),
    );
    // What the model is trained on, as LLaMA-Factory prints it: the first sample, readable.
    if let Some(text) = setup.first_sample()? {
        eprintln!("{text}");
    }
    eprintln!("run folder: {}", setup.plan.out_dir.display());
    let resumed = |r: resume::Resumed| {
        eprintln!(
            "resumed from {} at step {} (saved over {} rank(s))",
            r.dir.display(),
            r.step,
            r.world_size
        );
        if let Some(saved) = r.schedule_changed {
            eprintln!("note: the LR schedule differs from the checkpoint's: {saved}");
        }
    };
    let job_rank = job.as_ref().map(|c| (c.rank(), c.world_size()));
    // Every rank reads or draws its own shards (of the checkpoint, when resuming).
    if let Some(ckpt) = &ckpt {
        resumed(resume::resume_setup(&mut setup, ckpt)?);
    }
    let ranks = if let Some(comm) = job {
        eprintln!(
            "rank {} of {} on {} (FSDP over HCCL): memory figures are rank 0's (and the worst \
             rank's, *_worst_rank)",
            comm.rank(),
            comm.world_size(),
            comm.device()
        );
        Ranks::Hccl(comm)
    } else if setup.plan.cfg.parallel.nproc > 1 {
        eprintln!(
            "sharded over {} CPU ranks (FSDP): memory figures are rank 0's (and the worst \
             rank's, *_worst_rank)",
            setup.plan.cfg.parallel.nproc
        );
        Ranks::Cpu(setup.plan.cfg.parallel.nproc)
    } else {
        Ranks::Solo(exec)
    };
    // From here a SIGTERM or SIGINT finishes the step and saves a checkpoint (a second one
    // stops at once); before, there is nothing to save.
    crate::train::preempt::install();
    let summary = crate::train::sharded::run_sharded_on(&mut setup, ranks, &mut [])?;
    if let Some(last) = &summary.last_checkpoint {
        eprintln!("last checkpoint: {}", last.display());
    }
    let jsonl = setup.plan.jsonl.clone();
    if let Some((r, w)) = job_rank.filter(|&(r, _)| r != 0) {
        println!(
            "rank {r} of {w}: trained {} steps (rank 0 writes the metrics and the final model, \
             and evaluates)",
            summary.steps
        );
        return Ok(ExitCode::SUCCESS);
    }
    let mean_last = {
        let n = summary.losses.len().min(50);
        summary.losses[summary.losses.len() - n..]
            .iter()
            .sum::<f64>()
            / n.max(1) as f64
    };
    println!(
        "trained {} steps in {} (mean loss of the last {} steps {:.4}); metrics: {}; final \
         model: {}",
        summary.steps,
        crate::train::metrics::clock(summary.wall_s),
        summary.losses.len().min(50),
        mean_last,
        jsonl.display(),
        summary.final_model.display()
    );
    let Some(rep) = summary.eval else {
        return Ok(ExitCode::SUCCESS);
    };
    println!("held-out greedy answers ({} samples):", rep.samples);
    print!("{}", rep.table());
    if rep.meets_targets() {
        println!("every question type is at or above its target (error <= chance's / 3)");
        Ok(ExitCode::SUCCESS)
    } else if default_run {
        println!(
            "below the target on some question type: the built-in default did not learn enough"
        );
        Ok(ExitCode::from(1))
    } else {
        Ok(ExitCode::SUCCESS)
    }
}

/// Checks what a run would read, prints the resolved config and the command.
fn dry_run(plan: &ResolvedRun, force: bool) -> Result<(), TrainError> {
    let cfg = &plan.cfg;
    // The run folder as the run would find it: refused, continued, or moved aside.
    if let run_dir::Claim::MovedAside(moves) = run_dir::claim_would(plan, force)? {
        for (from, to) in moves {
            println!(
                "# --force: the run in {} would be moved aside to {}",
                from.display(),
                to.display()
            );
        }
    }
    let samples = SampleSetup::new(plan)?;
    for w in &samples.warnings {
        println!("# WARNING: {w}");
    }
    let (tok, mcfg) = (&samples.tok, &samples.mcfg);
    println!(
        "# tokenizer {}: vocabulary {}",
        plan.tokenizer.display(),
        tok.vocab_size()
    );
    let i = &samples.image;
    println!(
        "# images: longest edge {}, sides in multiples of {} px{}",
        i.longest_edge,
        i.rounding(),
        match (i.max_pixels, i.min_pixels) {
            (None, None) => String::new(),
            (max, min) => format!(", pixel limits {max:?} / {min:?}"),
        }
    );
    if let Some(s) = &samples.system {
        println!("# system prompt: {} chars", s.chars().count());
    }
    cfg.parallel.cp().check(
        mcfg.text_config.num_attention_heads,
        mcfg.text_config.num_key_value_heads,
    )?;
    let layout = ParamLayout::new(mcfg);
    println!("# model: {} parameters", layout.num_params());
    match &cfg.model.weights {
        Some(dir) => {
            // Headers only: every tensor's name, shape and dtype, and that its bytes are there.
            weights::HfWeights::open(dir, &layout).map_err(crate::model::ModelError::from)?;
            println!(
                "# weights {}: every tensor present, shapes match",
                dir.display()
            );
        }
        None => println!(
            "# weights: random initialisation (model.seed = {})",
            cfg.model.seed
        ),
    }
    let settings = samples.settings(cfg.data.max_len);
    let sets: Vec<(&str, &PathBuf)> = std::iter::once(("dataset", &plan.dataset))
        .chain(plan.eval_dataset.iter().map(|p| ("eval_dataset", p)))
        .collect();
    for (role, path) in sets {
        if let Some(s) = &plan.synth {
            println!(
                "# {role} {}: the synthetic set ({} samples) will be made in {} on the first run",
                path.display(),
                s.samples,
                s.dir.display()
            );
            continue;
        }
        let spec = DatasetSpec::resolve(path, cfg.data.dataset_dir.as_deref())?;
        // Through the index cache, as the run reads it: a dry run on each node leaves the
        // run's index there.
        let (ds, used) = DataSet::open_cached(&spec, tok, &settings, &plan.cache_dir)?;
        let st = &ds.stats;
        println!(
            "# {role} {}: {} samples, {} tokens, {} images, {} dropped by truncation, {} bad lines",
            path.display(),
            st.samples,
            st.tokens,
            st.images,
            st.dropped_truncated,
            st.bad_lines
        );
        println!("#   {}", used.describe());
        if let Some(e) = ds.bad.first() {
            println!("#   first bad line: {e}");
        }
        if st.samples == 0 {
            return Err(TrainError::Input(format!(
                "{}: no usable sample",
                path.display()
            )));
        }
    }
    match resume::resume_from(plan)? {
        Some(ckpt) => {
            ckpt.manifest().check_layout(&layout)?;
            println!(
                "# resume: {} (step {}, saved over {} rank(s))",
                ckpt.dir().display(),
                ckpt.step(),
                ckpt.manifest().world_size
            );
        }
        None if resolve::wants_resume(cfg) => println!(
            "# resume: no checkpoint in {} yet, the run starts at step 0",
            plan.checkpoint_dir.display()
        ),
        None => {}
    }
    print_config(plan);
    println!("# command: {}", command_line());
    Ok(())
}

/// This process's NPU: `LOCAL_RANK` when a launcher set it, else 0.
pub(super) fn local_rank() -> u32 {
    std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// With `parallel.device = npu` in a job of several processes (`WORLD_SIZE` > 1, as `cannon
/// launch` or torchrun set it): this process's rank, joined to the job's HCCL communicator
/// (root info through the TCP store at MASTER_ADDR:MASTER_PORT).
pub(super) fn npu_job(plan: &ResolvedRun) -> Result<Option<Communicator>, TrainError> {
    let world: usize = std::env::var("WORLD_SIZE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    if plan.cfg.parallel.device != DeviceKind::Npu {
        job_device(plan)?;
        return Ok(None);
    }
    // On the NPU the job's processes are the ranks (the config's nproc stays 1), so the CP
    // size is checked against the job here.
    let cp = plan.cfg.parallel.cp_size;
    if !world.is_multiple_of(cp) {
        return Err(TrainError::Input(format!(
            "parallel.cp_size = {cp} must divide the job's {world} process(es) (one rank per \
             NPU, world = dp x cp_size): start the run with `cannon launch --nproc N -- train \
             ...` for N a multiple of {cp}"
        )));
    }
    if world <= 1 {
        return Ok(None);
    }
    join_hccl()
}

#[cfg(feature = "npu")]
fn join_hccl() -> Result<Option<Communicator>, TrainError> {
    // How long a rank waits for its peers at start-up and at each collective.
    const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);
    Communicator::hccl_from_env(TIMEOUT)
        .map(Some)
        .map_err(|e| TrainError::Input(format!("joining the job's HCCL communicator: {e}")))
}

#[cfg(not(feature = "npu"))]
fn join_hccl() -> Result<Option<Communicator>, TrainError> {
    // Unreachable in practice: the config check refuses parallel.device = npu without npu.
    Err(TrainError::Input(
        "parallel.device = npu needs a build with `--features npu`".into(),
    ))
}
