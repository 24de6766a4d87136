//! `cannon launch`: one process per device, with torchrun's environment, as `torchrun
//! --nproc-per-node N` does for PyTorch on Ascend hosts.
//!
//! Each child is this same binary (or `--program`) with the arguments after `--`, and:
//! `RANK = node_rank * nproc + local_rank`, `WORLD_SIZE = nnodes * nproc`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE = nproc`, `GROUP_RANK = node_rank`, `MASTER_ADDR`, `MASTER_PORT`. Rank 0
//! serves the TCP store there, through which HCCL's root info reaches every rank
//! (`cannon_runtime::comm::rendezvous`).
//!
//! Every output line of a child is prefixed with `[rank R]` (stdout to stdout, stderr to
//! stderr, whole lines, never interleaved mid-line). When a child fails (non-zero exit or a
//! signal), the others get SIGTERM, then SIGKILL after `--grace` seconds, and `launch` exits 1
//! naming the rank that failed first. An HCCL job whose peer died would fail on its own within
//! `HCCL_EXEC_TIMEOUT`; stopping it at once is faster and leaves no orphans. SIGINT, SIGTERM or
//! SIGHUP to `launch` itself is passed on to the ranks as SIGTERM, once per signal: `cannon
//! train` ranks finish their step, save a checkpoint and exit 75 (`train::preempt`), and so
//! does `launch` when they all did; a second signal stops them at once (exit 128 + the
//! signal). A rank that exits 75 by itself (the scheduler signalled it) is not a failure.
//!
//! Several hosts: run `cannon launch` on each with the same `--nnodes`, `--nproc`,
//! `--master-addr` (the address of node 0, reachable from every node) and `--master-port`,
//! and each its own `--node-rank`.
//!
//! The job token: a rank joins the store only by proving it holds the job's token
//! (`cannon_runtime::comm::rendezvous`). On one node `launch` makes a fresh one per job (64
//! hex digits from the kernel's randomness) and hands it to its ranks as `CANNON_JOB_TOKEN`,
//! unless `CANNON_JOB_TOKEN` or `CANNON_JOB_TOKEN_FILE` is already set, which the ranks then
//! inherit. Several nodes must share one token, which separate launchers cannot invent: the
//! user sets the same `CANNON_JOB_TOKEN` on every node, or `CANNON_JOB_TOKEN_FILE` to a file
//! only they can read (e.g. in a home directory every node mounts); `launch` refuses to start
//! without one.

use crate::train::preempt::EXIT_PREEMPTED;
use clap::Args;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
#[command(
    after_help = "Example: cannon launch --nproc 8 -- train --config run.toml \
                        --set parallel.device=npu\n\
                        Two nodes (run on each; node 0's address is 10.0.0.1):\n  \
                        cannon launch --nnodes 2 --node-rank 0 --nproc 8 --master-addr 10.0.0.1 \
                        --master-port 29500 -- train ...\n  \
                        cannon launch --nnodes 2 --node-rank 1 --nproc 8 --master-addr 10.0.0.1 \
                        --master-port 29500 -- train ..."
)]
pub struct LaunchArgs {
    /// Processes on this node (one per NPU).
    #[arg(long, value_name = "N")]
    pub nproc: usize,
    /// Nodes in the job.
    #[arg(long, default_value_t = 1, value_name = "M")]
    pub nnodes: usize,
    /// This node's index in 0..nnodes (node 0 hosts rank 0 and the TCP store).
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub node_rank: usize,
    /// Address of node 0 as every node reaches it (default 127.0.0.1 for one node; required
    /// with several).
    #[arg(long, value_name = "ADDR")]
    pub master_addr: Option<String>,
    /// Port of the TCP store on node 0 (torchrun's default).
    #[arg(long, default_value_t = 29500, value_name = "P")]
    pub master_port: u16,
    /// Seconds between SIGTERM and SIGKILL for the other ranks when one fails.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    pub grace: f64,
    /// Run this executable instead of this cannon binary (as torchrun's --no-python).
    #[arg(long, value_name = "PATH")]
    pub program: Option<PathBuf>,
    /// The cannon subcommand and its arguments, after `--` (e.g. `-- train --config x.toml`).
    #[arg(last = true, required = true, value_name = "ARGS")]
    pub args: Vec<String>,
}

/// What `launch` was asked to run, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub world_size: usize,
    pub first_rank: usize,
    pub nproc: usize,
    pub node_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// The run folder's name every process of a one-node job shares (`CANNON_RUN_ID`): the
    /// launch's start time ([`Plan::name_run`]), so that ranks started in different seconds
    /// still agree. None with several nodes, whose launchers start at different times: such
    /// a job names its folder with `log.dir`.
    pub run_id: Option<String>,
    /// The job token `launch` made for its ranks ([`Plan::job_token`]); None when the
    /// environment already has one, which the ranks inherit.
    pub token: Option<String>,
}

impl LaunchArgs {
    /// Checks the arguments; the error is the usage message.
    pub fn plan(&self) -> Result<Plan, String> {
        if self.nproc == 0 {
            return Err("--nproc must be at least 1".into());
        }
        if self.nnodes == 0 {
            return Err("--nnodes must be at least 1".into());
        }
        if self.node_rank >= self.nnodes {
            return Err(format!(
                "--node-rank {} is not below --nnodes {}",
                self.node_rank, self.nnodes
            ));
        }
        if self.master_port == 0 {
            return Err("--master-port must be a port number (1-65535)".into());
        }
        if !(self.grace.is_finite() && self.grace >= 0.0) {
            return Err("--grace must be a non-negative number of seconds".into());
        }
        let master_addr = match (&self.master_addr, self.nnodes) {
            (Some(a), _) if !a.trim().is_empty() => a.trim().to_string(),
            (_, 1) => "127.0.0.1".into(),
            _ => {
                return Err(
                    "--master-addr is required with several nodes: node 0's address, as every \
                     node reaches it"
                        .into(),
                )
            }
        };
        Ok(Plan {
            world_size: self.nnodes * self.nproc,
            first_rank: self.node_rank * self.nproc,
            nproc: self.nproc,
            node_rank: self.node_rank,
            master_addr,
            master_port: self.master_port,
            run_id: None,
            token: None,
        })
    }
}

impl Plan {
    /// Names the run folder under `root` that a one-node job's processes share (a name not
    /// yet taken there); several nodes keep none. Kept out of [`LaunchArgs::plan`], which only
    /// checks arguments: this looks at the file system.
    pub fn name_run(&mut self, root: &Path) {
        if self.world_size == self.nproc {
            self.run_id = Some(crate::train::resolve::run_id_now(root));
        }
    }

    /// Gives the job its token (module doc): checks one the environment (`get`) holds, or
    /// makes one for a one-node job; several nodes without one are an error (the message).
    pub fn job_token(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), String> {
        use cannon_runtime::comm::rendezvous::{auth, JobToken};
        if JobToken::from_lookup(&get)
            .map_err(|e| e.to_string())?
            .is_some()
        {
            return Ok(());
        }
        if self.world_size != self.nproc {
            return Err(format!(
                "a job on several nodes needs one job token on every node, so that strangers                  cannot join its store: set {} to the same secret on each (e.g. `export                  {}=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n')` once, passed                  to every node) or {} to a file only you can read (chmod 600) that every node                  sees",
                auth::TOKEN_ENV,
                auth::TOKEN_ENV,
                auth::TOKEN_FILE_ENV
            ));
        }
        let t = JobToken::generate_hex()
            .map_err(|e| format!("cannot make a job token from /dev/urandom: {e}"))?;
        self.token = Some(t);
        Ok(())
    }

    /// The environment of local rank `local`.
    pub fn env(&self, local: usize) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("RANK", (self.first_rank + local).to_string()),
            ("WORLD_SIZE", self.world_size.to_string()),
            ("LOCAL_RANK", local.to_string()),
            ("LOCAL_WORLD_SIZE", self.nproc.to_string()),
            ("GROUP_RANK", self.node_rank.to_string()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", self.master_port.to_string()),
        ];
        if let Some(id) = &self.run_id {
            env.push((crate::train::resolve::RUN_ID_ENV, id.clone()));
        }
        if let Some(t) = &self.token {
            env.push((cannon_runtime::comm::rendezvous::auth::TOKEN_ENV, t.clone()));
        }
        env
    }
}

/// Copies `r` line by line to `out` (stdout or stderr), each line prefixed, under `lock` so
/// lines of different ranks never mix.
fn forward(
    r: impl Read + Send + 'static,
    prefix: String,
    lock: Arc<Mutex<()>>,
    to_stderr: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(r);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line.last() != Some(&b'\n') {
                line.push(b'\n');
            }
            let _g = lock.lock().unwrap_or_else(|e| e.into_inner());
            let w: &mut dyn Write = if to_stderr {
                &mut std::io::stderr().lock()
            } else {
                &mut std::io::stdout().lock()
            };
            let _ = w.write_all(prefix.as_bytes());
            let _ = w.write_all(&line);
            let _ = w.flush();
        }
    })
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => status.to_string(),
    }
}

/// Sends SIGTERM (a polite stop: the child may clean up) to a running child.
fn terminate(c: &Child) {
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped (try_wait said it
    // is running), so the pid cannot have been reused.
    unsafe {
        libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
    }
}

/// Refuses a job of several `cannon train` processes on the CPU: only NPU ranks join one
/// another (HCCL), so each CPU process would train the whole model alone, N runs writing one
/// run folder. (CPU ranks are in-process threads: `parallel.nproc`.) A config that does not
/// load is refused here too, once, rather than by every rank. Other subcommands pass.
pub fn refuse_cpu_training(args: &[String], world: usize) -> Result<(), String> {
    use crate::train::config::{DeviceKind, TrainConfig};
    use clap::Parser;
    #[derive(Parser)]
    struct Train {
        #[command(flatten)]
        args: super::train::TrainArgs,
    }
    if world <= 1 || args.first().map(String::as_str) != Some("train") {
        return Ok(());
    }
    let parsed = Train::try_parse_from(args).map_err(|e| e.to_string())?;
    let cfg = TrainConfig::load(parsed.args.config.as_deref(), &parsed.args.sets)
        .map_err(|e| e.to_string())?;
    if cfg.parallel.device == DeviceKind::Npu {
        return Ok(());
    }
    Err(format!(
        "{world} processes of `train` with parallel.device = {}: processes of a job join one \
         another only on the NPU, and on the CPU each would train the whole model alone into \
         the same run folder. Add --set parallel.device=npu, or train on the CPU in one process \
         with its ranks as threads: cannon train --set parallel.nproc={world} ...",
        format!("{:?}", cfg.parallel.device).to_lowercase()
    ))
}

/// Runs the job; the exit code of `launch`.
pub fn run(args: LaunchArgs) -> ExitCode {
    let mut plan = match args.plan() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("cannon launch: {e}");
            return ExitCode::from(2);
        }
    };
    if args.program.is_none() {
        if let Err(e) = refuse_cpu_training(&args.args, plan.world_size) {
            eprintln!("cannon launch: {e}");
            return ExitCode::from(2);
        }
    }
    // `cannon train`'s default run root, relative to the directory the job starts in.
    plan.name_run(Path::new("runs"));
    if let Err(e) = plan.job_token(|k| std::env::var(k).ok()) {
        eprintln!("cannon launch: {e}");
        return ExitCode::from(2);
    }
    let program = match &args.program {
        Some(p) => p.clone(),
        None => match std::env::current_exe() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("cannon launch: cannot find this executable: {e}");
                return ExitCode::from(2);
            }
        },
    };
    // Before the first rank starts: a signal from then on stops every rank started (exec resets
    // caught signals, so the ranks keep the default actions).
    install_stop_handlers();
    let lock = Arc::new(Mutex::new(()));
    let mut children: Vec<Option<Child>> = Vec::new();
    let mut pumps = Vec::new();
    for local in 0..plan.nproc {
        let rank = plan.first_rank + local;
        let spawned = Command::new(&program)
            .args(&args.args)
            .envs(plan.env(local))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        match spawned {
            Ok(mut c) => {
                let prefix = format!("[rank {rank}] ");
                if let Some(o) = c.stdout.take() {
                    pumps.push(forward(o, prefix.clone(), lock.clone(), false));
                }
                if let Some(e) = c.stderr.take() {
                    pumps.push(forward(e, prefix, lock.clone(), true));
                }
                children.push(Some(c));
            }
            Err(e) => {
                eprintln!(
                    "cannon launch: cannot start rank {rank} ({}): {e}",
                    program.display()
                );
                stop_all(&mut children, Duration::from_secs_f64(args.grace));
                return ExitCode::FAILURE;
            }
        }
    }
    eprintln!(
        "cannon launch: started ranks {}..{} of {} (master {}:{})",
        plan.first_rank,
        plan.first_rank + plan.nproc - 1,
        plan.world_size,
        plan.master_addr,
        plan.master_port
    );

    let mut failed: Option<(usize, String)> = None;
    let mut interrupted: Option<i32> = None;
    let (mut forwarded, mut preempted, mut killed) = (0usize, 0usize, 0usize);
    while children.iter().any(|c| c.is_some()) && failed.is_none() {
        let signals = STOP_SIGNALS.load(Ordering::SeqCst);
        if signals > forwarded {
            // Each signal `launch` gets is passed on once: the first asks the ranks to finish
            // their step and save a checkpoint (`cannon train`), a later one stops them at
            // once; past a second, the rest is SIGKILL after the grace.
            interrupted = Some(STOP_SIGNAL.load(Ordering::SeqCst));
            forwarded = signals;
            for c in children.iter().flatten() {
                terminate(c);
            }
            if signals >= 2 {
                break;
            }
        }
        for (local, slot) in children.iter_mut().enumerate() {
            let Some(c) = slot else { continue };
            match c.try_wait() {
                Ok(Some(st)) => {
                    *slot = None;
                    if st.code() == Some(i32::from(EXIT_PREEMPTED)) {
                        // Stopped by a signal of its own after saving its checkpoint: the
                        // others got it too (or get it from us) and stop after the same step.
                        preempted += 1;
                    } else if !st.success() && interrupted.is_some() {
                        // Stopped by the signal we passed on, without a checkpoint.
                        killed += 1;
                    } else if !st.success() {
                        failed = Some((plan.first_rank + local, describe(st)));
                        break;
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    *slot = None;
                    failed = Some((plan.first_rank + local, format!("cannot wait for it: {e}")));
                    break;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let stopped = children.iter().any(|c| c.is_some());
    if failed.is_some() || stopped {
        stop_all(&mut children, Duration::from_secs_f64(args.grace));
        // A grandchild that outlived its rank may hold the pipes open: take what output
        // arrives for a moment, then leave.
        let deadline = Instant::now() + Duration::from_secs(2);
        while pumps.iter().any(|p| !p.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    } else {
        for p in pumps {
            let _ = p.join();
        }
    }
    if let Some((rank, how)) = failed {
        eprintln!("cannon launch: rank {rank} failed first ({how}); the other ranks were stopped");
        return ExitCode::FAILURE;
    }
    if preempted > 0 && killed == 0 && !stopped {
        eprintln!(
            "cannon launch: the ranks stopped after a signal with their checkpoint written \
             (exit {EXIT_PREEMPTED}: resume with checkpoint.resume = true)"
        );
        return ExitCode::from(EXIT_PREEMPTED);
    }
    if let Some(sig) = interrupted {
        eprintln!("cannon launch: stopped by signal {sig}; the ranks were stopped");
        return ExitCode::from((128 + sig).clamp(1, 255) as u8);
    }
    ExitCode::SUCCESS
}

/// The last signal (SIGINT, SIGTERM, SIGHUP) that asked `launch` to stop, 0 while none did.
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// How many such signals came.
static STOP_SIGNALS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_stop_signal(sig: libc::c_int) {
    // Only atomic stores: async-signal-safe. The main loop passes the signal on.
    STOP_SIGNAL.store(sig, Ordering::SeqCst);
    STOP_SIGNALS.fetch_add(1, Ordering::SeqCst);
}

/// A scheduler cancelling the job signals `launch` only: forward it to the ranks (then SIGKILL
/// after the grace period) instead of leaving them orphaned, as torchrun does.
fn install_stop_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe); installing a
        // handler for these signals has no other effect on this process.
        unsafe {
            libc::signal(
                sig,
                on_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    }
}

/// SIGTERM to every running child, then SIGKILL to those still running after `grace`.
fn stop_all(children: &mut [Option<Child>], grace: Duration) {
    for c in children.iter_mut().flatten() {
        if matches!(c.try_wait(), Ok(None)) {
            terminate(c);
        }
    }
    let deadline = Instant::now() + grace;
    for slot in children.iter_mut() {
        let Some(c) = slot else { continue };
        loop {
            match c.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        *slot = None;
    }
}

/// Where this process sits in a launched job, from the environment `launch` (or torchrun)
/// sets: a line for `cannon doctor`, or None outside a job.
pub fn describe_env() -> Option<String> {
    let get = |k: &str| std::env::var(k).ok();
    let rank = get("RANK")?;
    Some(format!(
        "distributed: rank {rank} of {} (local rank {} of {}), master {}:{}",
        get("WORLD_SIZE").unwrap_or_else(|| "?".into()),
        get("LOCAL_RANK").unwrap_or_else(|| "?".into()),
        get("LOCAL_WORLD_SIZE").unwrap_or_else(|| "?".into()),
        get("MASTER_ADDR").unwrap_or_else(|| "?".into()),
        get("MASTER_PORT").unwrap_or_else(|| "?".into()),
    ))
}

/// In a launched job on an NPU build: joins the job's HCCL communicator (root info through the
/// TCP store), all-reduces `rank + 1` over the ranks and checks the sum. The line `cannon
/// doctor` prints, or None outside a job or without the `npu` feature.
pub fn collective_check() -> Option<Result<String, String>> {
    std::env::var_os("RANK")?;
    #[cfg(feature = "npu")]
    {
        Some(npu_collective_check())
    }
    #[cfg(not(feature = "npu"))]
    {
        None
    }
}

#[cfg(feature = "npu")]
fn npu_collective_check() -> Result<String, String> {
    use cannon_runtime::comm::{Communicator, ReduceOp};
    use cannon_runtime::{DeviceBuffer, Stream};
    let t0 = Instant::now();
    let comm = Communicator::hccl_from_env(Duration::from_secs(120)).map_err(|e| e.to_string())?;
    let (rank, n, device) = (comm.rank(), comm.world_size(), comm.device());
    let stream = Stream::new(comm.device()).map_err(|e| e.to_string())?;
    let mut x =
        DeviceBuffer::clone_htod(&stream, &[rank as i32 + 1; 4]).map_err(|e| e.to_string())?;
    comm.all_reduce_in_place(&mut x.view_mut(), ReduceOp::Sum, &stream)
        .map_err(|e| e.to_string())?;
    let got = x.clone_dtoh(&stream).map_err(|e| e.to_string())?;
    comm.barrier(&stream).map_err(|e| e.to_string())?;
    comm.destroy().map_err(|e| e.to_string())?;
    let want = (n * (n + 1) / 2) as i32;
    if got.iter().any(|&v| v != want) {
        return Err(format!(
            "all_reduce over {n} ranks gave {got:?}, expected {want}"
        ));
    }
    Ok(format!(
        "HCCL all_reduce over {n} ranks ok on {} ({:?})",
        device,
        t0.elapsed()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: LaunchArgs,
    }

    #[test]
    fn cpu_training_over_several_processes_is_refused_other_jobs_pass() {
        let train = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let err = refuse_cpu_training(&train(&["train"]), 4).unwrap_err();
        assert!(err.contains("parallel.device = cpu"), "{err}");
        assert!(err.contains("parallel.nproc=4"), "{err}");
        assert!(refuse_cpu_training(&train(&["train"]), 1).is_ok());
        assert!(refuse_cpu_training(&train(&["doctor"]), 4).is_ok());
        // A config that does not load is refused once, here, naming the key.
        let err = refuse_cpu_training(&train(&["train", "--set", "train.nope=1"]), 2).unwrap_err();
        assert!(err.contains("nope"), "{err}");
    }

    fn parse(args: &[&str]) -> Result<LaunchArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("launch").chain(args.iter().copied())).map(|c| c.a)
    }

    #[test]
    fn ranks_and_environment_of_one_and_two_nodes() {
        let a = parse(&["--nproc", "4", "--", "train", "--set", "x=1"]).unwrap();
        assert_eq!(a.args, vec!["train", "--set", "x=1"]);
        let mut p = a.plan().unwrap();
        assert_eq!(p.run_id, None, "plan only checks the arguments");
        p.name_run(Path::new("runs"));
        assert_eq!((p.world_size, p.first_rank), (4, 0));
        let env = p.env(3);
        assert!(env.contains(&("RANK", "3".into())));
        assert!(env.contains(&("MASTER_ADDR", "127.0.0.1".into())));
        assert!(env.contains(&("MASTER_PORT", "29500".into())));
        // One node: the launcher names the run folder all its processes share.
        let id = p.run_id.clone().unwrap();
        assert!(env.contains(&("CANNON_RUN_ID", id)), "{env:?}");

        let b = parse(&[
            "--nproc",
            "8",
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--master-addr",
            "10.0.0.1",
            "--master-port",
            "1234",
            "--",
            "train",
        ])
        .unwrap();
        let mut p = b.plan().unwrap();
        p.name_run(Path::new("runs"));
        assert_eq!((p.world_size, p.first_rank), (16, 8));
        let env = p.env(2);
        for want in [
            ("RANK", "10"),
            ("WORLD_SIZE", "16"),
            ("LOCAL_RANK", "2"),
            ("LOCAL_WORLD_SIZE", "8"),
            ("GROUP_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "1234"),
        ] {
            assert!(
                env.contains(&(want.0, want.1.to_string())),
                "{want:?} in {env:?}"
            );
        }
        // Several nodes start their launchers at different times: no shared name (log.dir).
        assert!(env.iter().all(|(k, _)| *k != "CANNON_RUN_ID"), "{env:?}");
    }

    #[test]
    fn each_one_node_job_gets_its_own_token_and_several_nodes_need_one_given() {
        let none = |_: &str| None;
        let token_of = |p: &Plan| {
            p.env(0)
                .into_iter()
                .find(|(k, _)| *k == "CANNON_JOB_TOKEN")
                .map(|(_, v)| v)
        };
        let one = parse(&["--nproc", "2", "--", "train"]).unwrap();
        let mut a = one.plan().unwrap();
        a.job_token(none).unwrap();
        let mut b = one.plan().unwrap();
        b.job_token(none).unwrap();
        let (ta, tb) = (token_of(&a).unwrap(), token_of(&b).unwrap());
        assert_eq!(ta.len(), 64);
        assert!(ta.bytes().all(|c| c.is_ascii_hexdigit()), "{ta}");
        assert_ne!(ta, tb, "two jobs, two tokens");
        // Every rank of the job gets the same one.
        assert_eq!(
            a.env(1)
                .iter()
                .find(|(k, _)| *k == "CANNON_JOB_TOKEN")
                .unwrap()
                .1,
            ta
        );

        // A token already set is the job's: the ranks inherit it, launch adds none.
        let given = |k: &str| (k == "CANNON_JOB_TOKEN").then(|| "a-token-of-the-user-123".into());
        let mut c = one.plan().unwrap();
        c.job_token(given).unwrap();
        assert_eq!(token_of(&c), None);
        let short = |k: &str| (k == "CANNON_JOB_TOKEN").then(|| "short".into());
        let e = one.plan().unwrap().job_token(short).unwrap_err();
        assert!(e.contains("too short"), "{e}");

        let two = parse(&[
            "--nproc",
            "2",
            "--nnodes",
            "2",
            "--master-addr",
            "10.0.0.1",
            "--",
            "train",
        ])
        .unwrap();
        let e = two.plan().unwrap().job_token(none).unwrap_err();
        assert!(
            e.contains("CANNON_JOB_TOKEN") && e.contains("CANNON_JOB_TOKEN_FILE"),
            "{e}"
        );
        let mut d = two.plan().unwrap();
        d.job_token(given).unwrap();
        assert_eq!(token_of(&d), None);
    }

    #[test]
    fn bad_plans_are_usage_errors() {
        let bad = |args: &[&str]| parse(args).unwrap().plan().unwrap_err();
        assert!(bad(&["--nproc", "0", "--", "x"]).contains("--nproc"));
        assert!(bad(&["--nproc", "2", "--nnodes", "2", "--", "x"]).contains("--master-addr"));
        assert!(bad(&[
            "--nproc",
            "2",
            "--nnodes",
            "2",
            "--node-rank",
            "2",
            "--master-addr",
            "a",
            "--",
            "x"
        ])
        .contains("--node-rank 2"));
        assert!(
            parse(&["--nproc", "2"]).is_err(),
            "the command after -- is required"
        );
    }
}
