//! Preemption: SIGTERM to `cannon train` mid-run finishes the step, writes a checkpoint on
//! every rank and exits 75; the run resumed from it ends with the uninterrupted run's losses,
//! bit for bit, on one rank and on two. A second signal a moment later stops the process at
//! once.

mod common;
use common::{scratch, small_default_train};
use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_cannon");

/// `cannon train` of the tiny default on a small synthetic set, 300 steps of 4 rows (a few
/// seconds: long enough to be signalled mid-run), into `dir`.
fn command(dir: &Path, extra: &[&str]) -> Command {
    let mut sets = vec!["train.steps=300", "train.warmup_steps=4"];
    sets.extend_from_slice(extra);
    let mut cmd = small_default_train(BIN, dir, &sets);
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    cmd
}

/// step -> loss of the step records in a run's metrics.jsonl (a resumed run appends; the
/// last record of a step wins).
fn losses(dir: &Path) -> Vec<(u64, f64)> {
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap_or_default();
    let mut by_step = std::collections::BTreeMap::new();
    for l in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(l) else {
            continue;
        };
        if let (Some(s), Some(loss)) = (v["step"].as_u64(), v["loss"].as_f64()) {
            by_step.insert(s, loss);
        }
    }
    by_step.into_iter().collect()
}

/// Waits until the run has logged `n` steps (or fails the test after a minute).
fn wait_for_steps(child: &mut Child, dir: &Path, n: usize) {
    let t0 = Instant::now();
    while losses(dir).len() < n {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before step {n}"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no step {n} after 2 min"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The run trained to its end: exit 0, or 1 when the default's held-out accuracy is below
/// its targets (a short run's is).
fn trained(st: &std::process::ExitStatus) -> bool {
    matches!(st.code(), Some(0 | 1))
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child, which has not been waited for (its pid is ours).
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

#[test]
fn sigterm_checkpoints_and_the_resumed_run_equals_the_uninterrupted_one() {
    for nproc in [1, 2] {
        let root = scratch("train-preempt", &format!("ranks{nproc}"));
        let ranks = format!("parallel.nproc={nproc}");
        let whole = root.join("whole");
        let out = command(&whole, &[&ranks]).output().unwrap();
        assert!(
            trained(&out.status),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );

        let cut = root.join("cut");
        let mut child = command(&cut, &[&ranks]).spawn().unwrap();
        wait_for_steps(&mut child, &cut, 2);
        signal(&child, libc::SIGTERM);
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(75), "{nproc} rank(s): {err}");
        let done = losses(&cut).len();
        assert!((2..40).contains(&done), "stopped after step {done}: {err}");
        assert!(
            err.contains(&format!("stopped by SIGTERM after step {done}")),
            "{err}"
        );
        let ckpt = cut.join("checkpoints").join(format!("step-{done:06}"));
        assert!(ckpt.join("manifest.json").is_file(), "{}", ckpt.display());
        // No final model: the run is not over.
        assert!(!cut.join("final").join("model.safetensors").exists());

        let out = command(&cut, &[&ranks, "checkpoint.resume=true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(trained(&out.status), "{err}");
        assert!(err.contains(&format!("at step {done}")), "{err}");
        assert_eq!(losses(&cut), losses(&whole), "{nproc} rank(s)");
    }
}

/// The handler's own rules, in a child process that only waits (this test binary run again
/// with `PREEMPT_CHILD` set): the first SIGTERM sets the flag, a second one within the
/// duplicate window is ignored (a scheduler and `cannon launch` both passing the same
/// event), and one after it ends the process at once with 128 + 15.
#[test]
fn a_second_signal_stops_at_once() {
    if std::env::var_os("PREEMPT_CHILD").is_some() {
        cannon_trainer::train::preempt::install();
        println!("ready");
        loop {
            if cannon_trainer::train::preempt::requested() == Some(libc::SIGTERM) {
                println!("requested");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["a_second_signal_stops_at_once", "--exact", "--nocapture"])
        .env("PREEMPT_CHILD", "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut read_until = |want: &str| loop {
        line.clear();
        use std::io::BufRead;
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "child ended before {want}"
        );
        if line.trim() == want {
            return;
        }
    };
    read_until("ready");
    signal(&child, libc::SIGTERM);
    read_until("requested");
    // Within the window: ignored.
    signal(&child, libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.try_wait().unwrap().is_none(),
        "a duplicate signal stopped it"
    );
    std::thread::sleep(cannon_trainer::train::preempt::SECOND_SIGNAL_AFTER);
    signal(&child, libc::SIGTERM);
    let t0 = Instant::now();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    assert!(t0.elapsed() < Duration::from_secs(5));
}
