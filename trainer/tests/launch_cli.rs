//! `cannon launch`: the children's environment and prefixed output, and a failing rank stopping
//! the job (naming the rank, the others stopped within the grace period).

use std::process::Command;
use std::time::{Duration, Instant};

fn cannon() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cannon"))
}

/// `cannon` whose children use the CANN the NPU tests use (`select_for_tests`: the emulator
/// cargo built, passed on as `CANNON_CANN_EMULATOR`, or the installed CANN on an Ascend host):
/// in NPU builds a launched `doctor` joins an HCCL communicator.
fn cannon_with_cann() -> Command {
    #[allow(unused_mut)]
    let mut cmd = cannon();
    #[cfg(feature = "npu")]
    {
        use cannon_sys::emulator::{select_for_tests, TestCann, ENV};
        match select_for_tests() {
            Ok(TestCann::Emulator(p)) => {
                cmd.env(ENV, p);
            }
            Ok(TestCann::Installed(_)) => {}
            Err(e) => panic!("{e}"),
        }
    }
    cmd
}

/// `cannon launch --nproc N --grace G` of `/bin/sh -c script`: every rank runs the script.
fn launch_sh(nproc: usize, grace_s: u32, script: &str) -> Command {
    let mut cmd = cannon();
    cmd.args(["launch", "--nproc", &nproc.to_string(), "--grace"])
        .arg(grace_s.to_string())
        .args(["--program", "/bin/sh", "--", "-c", script]);
    cmd
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn children_get_the_torchrun_environment_and_prefixed_output() {
    let port = free_port();
    let out = cannon_with_cann()
        .args([
            "launch",
            "--nproc",
            "2",
            "--master-port",
            &port.to_string(),
            "--",
            "doctor",
        ])
        .env_remove("RANK")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for r in 0..2 {
        let want = format!(
            "[rank {r}] distributed: rank {r} of 2 (local rank {r} of 2), master 127.0.0.1:{port}"
        );
        assert!(
            stdout.lines().any(|l| l == want),
            "{want:?} missing in\n{stdout}"
        );
    }
    // Every line of the children carries its rank.
    assert!(stdout.lines().all(|l| l.starts_with("[rank ")), "{stdout}");
    assert!(stderr.contains("started ranks 0..1 of 2"), "{stderr}");
}

#[test]
fn a_failing_rank_stops_the_job_and_is_named() {
    let sh = "if [ \"$RANK\" = 1 ]; then echo bye from $LOCAL_RANK; exit 3; fi; exec sleep 60";
    let t0 = Instant::now();
    let out = launch_sh(3, 5, sh).output().unwrap();
    let took = t0.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("[rank 1] bye from 1"), "{stdout}");
    assert!(
        stderr.contains("rank 1 failed first (exit code 3); the other ranks were stopped"),
        "{stderr}"
    );
    // The sleeping ranks took SIGTERM at once: far from the 60 s sleep, under the grace.
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn ranks_that_ignore_sigterm_are_killed_after_the_grace_period() {
    let sh = "if [ \"$RANK\" = 0 ]; then exit 7; fi; trap '' TERM; exec sleep 60";
    let t0 = Instant::now();
    let out = launch_sh(2, 1, sh).output().unwrap();
    let took = t0.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("rank 0 failed first (exit code 7)"),
        "{stderr}"
    );
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(10),
        "{took:?}"
    );
}

/// Each job's ranks share one fresh token; a token already in the environment is passed on
/// unchanged; several nodes without one are refused before any rank starts.
#[test]
fn launch_gives_each_job_one_token_for_all_its_ranks() {
    let tokens = |out: &std::process::Output| -> Vec<String> {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}");
        stdout
            .lines()
            .filter_map(|l| l.split_once("token=").map(|(_, t)| t.to_string()))
            .collect()
    };
    let sh = "echo token=$CANNON_JOB_TOKEN";
    let a = tokens(
        &launch_sh(3, 5, sh)
            .env_remove("CANNON_JOB_TOKEN")
            .env_remove("CANNON_JOB_TOKEN_FILE")
            .output()
            .unwrap(),
    );
    let b = tokens(
        &launch_sh(1, 5, sh)
            .env_remove("CANNON_JOB_TOKEN")
            .env_remove("CANNON_JOB_TOKEN_FILE")
            .output()
            .unwrap(),
    );
    assert_eq!(a.len(), 3, "{a:?}");
    assert!(a.iter().all(|t| t == &a[0]), "{a:?}");
    assert!(
        a[0].len() == 64 && a[0].bytes().all(|c| c.is_ascii_hexdigit()),
        "{a:?}"
    );
    assert_ne!(a[0], b[0], "a new job, a new token");
    let mine = "users-own-token-0123456789";
    let c = tokens(
        &launch_sh(2, 5, sh)
            .env("CANNON_JOB_TOKEN", mine)
            .output()
            .unwrap(),
    );
    assert_eq!(c, vec![mine.to_string(); 2]);

    let out = cannon()
        .args([
            "launch",
            "--nproc",
            "1",
            "--nnodes",
            "2",
            "--master-addr",
            "10.0.0.1",
        ])
        .args(["--program", "/bin/sh", "--", "-c", "echo started"])
        .env_remove("CANNON_JOB_TOKEN")
        .env_remove("CANNON_JOB_TOKEN_FILE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("CANNON_JOB_TOKEN_FILE"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("started"));
}

#[test]
fn usage_errors_exit_2() {
    let out = cannon()
        .args(["launch", "--nproc", "2", "--nnodes", "2", "--", "doctor"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--master-addr is required"));
}

/// On an NPU build every launched rank joins one HCCL communicator (root info through the TCP
/// store at MASTER_ADDR:MASTER_PORT) and all-reduces: `cannon doctor` reports it per rank.
/// Against the emulator cargo built, or the installed CANN on an Ascend host.
#[cfg(feature = "npu")]
#[test]
fn launched_ranks_join_one_hccl_communicator() {
    let port = free_port();
    let out = cannon_with_cann()
        .args([
            "launch",
            "--nproc",
            "4",
            "--master-port",
            &port.to_string(),
            "--",
            "doctor",
        ])
        .env("HCCL_CONNECT_TIMEOUT", "60")
        .env("HCCL_EXEC_TIMEOUT", "60")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for r in 0..4 {
        let want = format!("[rank {r}] collectives: HCCL all_reduce over 4 ranks ok on npu:{r}");
        assert!(
            stdout.lines().any(|l| l.starts_with(&want)),
            "{want:?} missing in\n{stdout}"
        );
    }
}

#[test]
fn sigterm_to_launch_stops_every_rank() {
    // Each rank prints its pid (the exec'd sleep keeps it) and sleeps.
    let sh = "echo pid $$; exec sleep 60";
    let mut child = launch_sh(2, 2, sh)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut pids = Vec::new();
    while pids.len() < 2 {
        let l = lines.next().unwrap().unwrap();
        if let Some(p) = l.split("pid ").nth(1) {
            pids.push(p.trim().parse::<i32>().unwrap());
        }
    }
    let t0 = Instant::now();
    // SAFETY: kill(2) on our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    for p in pids {
        // SAFETY: signal 0 only checks whether the process exists.
        let alive = unsafe { libc::kill(p, 0) } == 0;
        assert!(!alive, "rank process {p} outlived launch");
    }
}

/// `cannon train`'s preemption as ranks see it: SIGTERM to `launch` reaches each rank once;
/// ranks that save and exit 75 (here a script that does so on its first TERM, and counts
/// them) make `launch` exit 75 as well, not a failure.
#[test]
fn sigterm_to_launch_reaches_each_rank_once_and_75_is_passed_on() {
    let sh = "n=0; trap 'n=$((n+1)); echo terms $n; sleep 0.3; exit 75' TERM; echo ready; \
              while :; do sleep 0.05; done";
    let mut child = launch_sh(2, 5, sh)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut ready = 0;
    while ready < 2 {
        ready += usize::from(lines.next().unwrap().unwrap().ends_with("ready"));
    }
    // SAFETY: kill(2) on our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(75), "{status}: {rest:?}");
    let terms: Vec<&String> = rest.iter().filter(|l| l.contains("terms")).collect();
    assert_eq!(terms.len(), 2, "{rest:?}");
    assert!(terms.iter().all(|l| l.ends_with("terms 1")), "{rest:?}");
}

/// `train` on the CPU runs its ranks as threads of one process: N launched CPU trainings would
/// each train the whole model into one run folder. `launch` refuses before starting a rank.
#[test]
fn launching_training_on_the_cpu_is_refused_before_any_rank_starts() {
    let dir = std::env::temp_dir().join(format!("cannon-launch-cpu-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    let out = cannon()
        .args(["launch", "--nproc", "2", "--master-port"])
        .arg(free_port().to_string())
        .args(["--", "train", "--set"])
        .arg(format!("log.dir={:?}", dir.display().to_string()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("parallel.device = cpu") && stderr.contains("parallel.nproc=2"),
        "{stderr}"
    );
    assert!(!stderr.contains("[rank"), "a rank started: {stderr}");
    assert!(!dir.exists());
}
