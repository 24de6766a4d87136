//! The torchrun-style environment and the file rendezvous that ships HCCL's root info.

use std::time::{Duration, Instant};

use cannon_runtime::comm::rendezvous::{DistEnv, FileRendezvous};
use cannon_runtime::comm::CommError;

fn tmp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("cannon-rdzv-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn env_parsing() {
    let env = |vars: &'static [(&'static str, &'static str)]| {
        DistEnv::from_lookup(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    };
    let ok = env(&[("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1")]).unwrap();
    assert_eq!(
        ok,
        DistEnv {
            rank: 3,
            world_size: 8,
            local_rank: 1
        }
    );
    let missing = env(&[("RANK", "0"), ("LOCAL_RANK", "0")]).unwrap_err();
    assert!(
        matches!(
            missing,
            CommError::Env {
                var: "WORLD_SIZE",
                ..
            }
        ),
        "{missing}"
    );
    let bad = env(&[("RANK", "x"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")]).unwrap_err();
    assert!(
        bad.to_string()
            .contains("\"x\" is not a non-negative integer"),
        "{bad}"
    );
    let out = env(&[("RANK", "2"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")]).unwrap_err();
    assert!(matches!(out, CommError::Env { var: "RANK", .. }), "{out}");
}

#[test]
fn root_info_reaches_every_rank() {
    let dir = tmp_dir("ok");
    let rdzv = FileRendezvous::new(&dir, "job-1").unwrap();
    // The 4108-byte HcclRootInfo, with a recognisable pattern.
    let payload: Vec<u8> = (0..4108u32).map(|i| (i * 31 % 251) as u8).collect();
    let got = std::thread::scope(|s| {
        let readers: Vec<_> = (1..4)
            .map(|_| {
                s.spawn(|| rdzv.wait(4, 4108, Duration::from_secs(10), Duration::from_millis(5)))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(30));
        rdzv.publish(4, &payload).unwrap();
        readers
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect::<Vec<_>>()
    });
    for g in got {
        assert_eq!(g, payload);
    }
    rdzv.remove().unwrap();
    assert!(!rdzv.path().exists());
    rdzv.remove().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rendezvous_failures_are_errors() {
    let dir = tmp_dir("fail");
    let rdzv = FileRendezvous::new(&dir, "job-2").unwrap();
    let t = Instant::now();
    let e = rdzv
        .wait(2, 16, Duration::from_millis(100), Duration::from_millis(10))
        .unwrap_err();
    assert!(t.elapsed() >= Duration::from_millis(100) && t.elapsed() < Duration::from_secs(3));
    assert!(e.to_string().contains("did not publish"), "{e}");

    // A stale file from a run with another world size, and a wrong payload size.
    rdzv.publish(8, &[1u8; 16]).unwrap();
    let stale = rdzv
        .wait(2, 16, Duration::from_secs(1), Duration::from_millis(5))
        .unwrap_err();
    assert!(
        stale.to_string().contains("world of 8, this job has 2"),
        "{stale}"
    );
    let short = rdzv
        .wait(8, 4108, Duration::from_secs(1), Duration::from_millis(5))
        .unwrap_err();
    assert!(short.to_string().contains("expected 4108"), "{short}");

    assert!(FileRendezvous::new(&dir, "../escape").is_err());
    let _ = std::fs::remove_dir_all(&dir);
}
