//! The HCCL communicator with one process per NPU, as on Ascend hosts: this test binary starts
//! itself once per rank (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/MASTER_PORT: rank 0's root
//! info goes through the TCP store), each rank on `Device::Npu(LOCAL_RANK)`.
//!
//! Against the CANN `cannon_sys::emulator::select_for_tests` picks: the emulator cargo builds
//! (`cargo build --release -p cannon-cann-emu`), or the installed CANN on an Ascend host.
//!
//! - `collectives_match_the_cpu_communicator`: 1, 2, 4 and 8 ranks run one program of every
//!   collective through `Communicator`; each rank also runs the same program on an in-process
//!   CPU world with the same inputs and compares its own results. Integers, max and min and
//!   data movement: exact. Sums in f32: `|hccl - cpu| <= (n - 1) * eps_f32 * sum_r |x_r|` per
//!   element, the worst-case bound of summing n terms in any order (the CPU adds in rank order;
//!   HCCL's order is its own; the emulator also adds in rank order, so there it is exact). Sums
//!   in bf16: `n * 2^-8 * sum_r |x_r|` (the CPU rounds once from an f32 sum; HCCL may round
//!   after every step, each at most half a bf16 ulp of a partial sum).
//! - `a_killed_rank_fails_the_others`, `a_hung_rank_fails_the_others`: a rank killed (SIGKILL)
//!   while the others wait in a collective, and a rank alive that never calls: every other rank
//!   gets an error (at stream synchronise and from `check_async_error`), the first at once, the
//!   second within HCCL_EXEC_TIMEOUT. Never a hang.
#![cfg(feature = "npu")]

#[path = "hccl_procs/harness.rs"]
mod harness;
#[path = "hccl_procs/program.rs"]
mod program;

use std::time::{Duration, Instant};

use cannon_runtime::comm::{Communicator, ReduceOp};
use cannon_runtime::{Device, DeviceBuffer, Stream};

const T: Duration = Duration::from_secs(60);

#[test]
fn collectives_match_the_cpu_communicator() {
    if harness::role().as_deref() == Some("collectives") {
        return program::rank_main();
    }
    for n in [1usize, 2, 4, 8] {
        let t0 = Instant::now();
        let env = [
            ("HCCL_CONNECT_TIMEOUT", "60".to_string()),
            ("HCCL_EXEC_TIMEOUT", "60".to_string()),
        ];
        let mut ranks = harness::start(
            "collectives_match_the_cpu_communicator",
            "collectives",
            n,
            &env,
        );
        let codes: Vec<_> = ranks
            .iter_mut()
            .map(|r| r.finish(Duration::from_secs(240)))
            .collect();
        let logs: Vec<String> = ranks.iter().map(|r| r.log()).collect();
        assert!(
            codes.iter().all(|&c| c == Some(0)),
            "{n} ranks: exit codes {codes:?}\n{}",
            logs.join("\n")
        );
        for r in &ranks {
            let ok = r
                .output
                .iter()
                .find(|l| l.contains("CANNON_CHECKS"))
                .cloned();
            assert!(
                ok.is_some(),
                "rank {} reported no checks\n{}",
                r.rank,
                r.log()
            );
            eprintln!("{n} ranks: {}", ok.unwrap_or_default());
        }
        eprintln!("{n} ranks took {:?}", t0.elapsed());
    }
}

/// One iteration of the failure scenarios: an all_reduce and a synchronise.
fn step(comm: &Communicator, stream: &Stream, x: &mut DeviceBuffer<f32>) -> Result<(), String> {
    comm.all_reduce_in_place(&mut x.view_mut(), ReduceOp::Sum, stream)
        .map_err(|e| e.to_string())?;
    stream.synchronize().map_err(|e| e.to_string())
}

/// Ranks of the failure scenarios: `victim` announces itself and sleeps (to be killed, or to
/// hang); the others run collectives until one fails and report how.
fn failure_rank(victim: usize) {
    let rank = harness::env_rank();
    let comm = Communicator::hccl_from_env(T).unwrap();
    let stream = Stream::new(comm.device()).unwrap();
    let mut x = DeviceBuffer::clone_htod(&stream, &[1.0f32; 64]).unwrap();
    // Every rank is in: one collective that succeeds.
    step(&comm, &stream, &mut x).unwrap();
    if rank == victim {
        println!("CANNON_READY");
        std::thread::sleep(Duration::from_secs(600));
        std::process::exit(0);
    }
    let t0 = Instant::now();
    let err = loop {
        if let Err(e) = step(&comm, &stream, &mut x) {
            break e;
        }
        assert!(t0.elapsed() < T, "no error after {T:?}: a hang");
    };
    let async_err = comm.check_async_error();
    println!(
        "CANNON_FAILED after {:?}: {err}; async: {async_err:?}",
        t0.elapsed()
    );
    assert!(
        async_err.is_err(),
        "HcclGetCommAsyncError must report the failure"
    );
    std::process::exit(0);
}

/// Runs a failure scenario on `n` ranks; returns each survivor's FAILED line and the time from
/// `act` on the victim to the last survivor's exit.
fn failure_world(
    test: &str,
    role: &str,
    exec_timeout: &str,
    kill: bool,
) -> (Vec<String>, Duration) {
    let n = 3;
    let victim = n - 1;
    let env = [
        ("HCCL_CONNECT_TIMEOUT", "60".to_string()),
        ("HCCL_EXEC_TIMEOUT", exec_timeout.to_string()),
    ];
    let mut ranks = harness::start(test, role, n, &env);
    assert!(
        ranks[victim].wait_for_line("CANNON_READY", T),
        "{}",
        ranks[victim].log()
    );
    // Let the survivors block in their next collective, waiting for the victim.
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    if kill {
        ranks[victim].child.kill().unwrap();
    }
    let mut lines = Vec::new();
    for r in ranks.iter_mut().filter(|r| r.rank != victim) {
        let code = r.finish(T);
        assert_eq!(code, Some(0), "{}", r.log());
        let l = r
            .output
            .iter()
            .find(|l| l.contains("CANNON_FAILED"))
            .cloned();
        lines.push(l.unwrap_or_else(|| panic!("no failure reported\n{}", r.log())));
    }
    let took = t0.elapsed();
    let _ = ranks[victim].child.kill();
    ranks[victim].finish(Duration::from_secs(10));
    (lines, took)
}

#[test]
fn a_killed_rank_fails_the_others() {
    if harness::role().as_deref() == Some("kill") {
        return failure_rank(2);
    }
    // HCCL_EXEC_TIMEOUT is long: the survivors must notice the closed connections, not wait.
    let (lines, took) = failure_world("a_killed_rank_fails_the_others", "kill", "120", true);
    for l in &lines {
        assert!(l.contains("Hccl"), "{l}");
        eprintln!("{l}");
    }
    assert!(
        took < Duration::from_secs(20),
        "survivors took {took:?} after the kill"
    );
    eprintln!("survivors failed {took:?} after the kill");
}

#[test]
fn a_hung_rank_fails_the_others() {
    if harness::role().as_deref() == Some("hang") {
        return failure_rank(2);
    }
    let (lines, took) = failure_world("a_hung_rank_fails_the_others", "hang", "2", false);
    for l in &lines {
        assert!(l.contains("Hccl"), "{l}");
        eprintln!("{l}");
    }
    assert!(took < Duration::from_secs(30), "survivors took {took:?}");
    eprintln!("survivors failed {took:?} after the victim stopped calling (HCCL_EXEC_TIMEOUT=2)");
}

/// Rank 0's root info through the file rendezvous instead of the store: the same bootstrap
/// from a shared directory.
#[test]
fn the_file_rendezvous_also_bootstraps() {
    if harness::role().as_deref() == Some("file") {
        let comm = Communicator::hccl_from_env(T).unwrap();
        let stream = Stream::new(comm.device()).unwrap();
        assert_eq!(comm.device(), Device::Npu(harness::env_rank() as u32));
        let mut x = DeviceBuffer::clone_htod(&stream, &[comm.rank() as i32 + 1; 3]).unwrap();
        comm.all_reduce_in_place(&mut x.view_mut(), ReduceOp::Sum, &stream)
            .unwrap();
        assert_eq!(x.clone_dtoh(&stream).unwrap(), vec![3; 3]);
        comm.destroy().unwrap();
        println!("CANNON_OK");
        return;
    }
    let dir = std::env::temp_dir().join(format!("cannon-hccl-file-{}", std::process::id()));
    let env = [
        ("CANNON_RDZV_DIR", dir.display().to_string()),
        ("CANNON_RDZV_ID", "procs".to_string()),
    ];
    let mut ranks = harness::start("the_file_rendezvous_also_bootstraps", "file", 2, &env);
    for r in &mut ranks {
        assert_eq!(r.finish(T), Some(0), "{}", r.log());
        assert!(
            r.output.iter().any(|l| l.contains("CANNON_OK")),
            "{}",
            r.log()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
