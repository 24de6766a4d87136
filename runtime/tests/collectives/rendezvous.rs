//! The torchrun-style environment and the rendezvous (file, TCP store) that ships HCCL's root
//! info.

use std::time::{Duration, Instant};

use cannon_runtime::comm::rendezvous::{DistEnv, FileRendezvous, Rendezvous, TcpStore};
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

/// A port nothing listens on right now (bound and released; tests pick their own).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn dist(rank: usize, world_size: usize) -> DistEnv {
    DistEnv {
        rank,
        world_size,
        local_rank: rank,
    }
}

#[test]
fn tcp_store_ships_the_root_info_to_every_rank() {
    let port = free_port();
    let payload: Vec<u8> = (0..4108u32).map(|i| (i * 7 % 253) as u8).collect();
    let vars = move |k: &str| match k {
        "MASTER_ADDR" => Some("127.0.0.1".to_string()),
        "MASTER_PORT" => Some(port.to_string()),
        "CANNON_RDZV_ID" => Some("job-tcp".to_string()),
        _ => None,
    };
    let t = Duration::from_secs(20);
    let got = std::thread::scope(|s| {
        // Ranks 1..3 start first: they retry until rank 0 serves.
        let readers: Vec<_> = (1..4)
            .map(|r| {
                s.spawn(move || {
                    let rdzv = Rendezvous::from_lookup(vars, &dist(r, 4), t).unwrap();
                    assert!(
                        rdzv.describe().ends_with("/job-tcp/root"),
                        "{}",
                        rdzv.describe()
                    );
                    let got = rdzv.wait(4, 4108, t).unwrap();
                    // A sub-group key of the same store is another key.
                    let child = rdzv.child("split0").unwrap();
                    let sub = child.wait(4, 3, t).unwrap();
                    (got, sub)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        let root = Rendezvous::from_lookup(vars, &dist(0, 4), t).unwrap();
        root.publish(4, &payload).unwrap();
        root.child("split0")
            .unwrap()
            .publish(4, &[1, 2, 3])
            .unwrap();
        let out: Vec<_> = readers.into_iter().map(|h| h.join().unwrap()).collect();
        root.remove().unwrap();
        let gone = root.wait(4, 4108, Duration::from_millis(50)).unwrap_err();
        assert!(matches!(gone, CommError::StoreTimeout { .. }), "{gone}");
        out
    });
    for (g, sub) in got {
        assert_eq!(g, payload);
        assert_eq!(sub, vec![1, 2, 3]);
    }
}

#[test]
fn tcp_store_timeouts_and_mismatches_are_typed() {
    // Nobody serves: connecting gives up after the timeout.
    let port = free_port();
    let t0 = Instant::now();
    let e = TcpStore::connect("127.0.0.1", port, 1, 2, Duration::from_millis(200)).unwrap_err();
    assert!(matches!(e, CommError::StoreTimeout { .. }), "{e}");
    assert!(t0.elapsed() >= Duration::from_millis(200) && t0.elapsed() < Duration::from_secs(5));

    // A key nobody sets.
    let port = free_port();
    // (Its timeout is also how long it lingers, at drop, for clients still connected.)
    let server = TcpStore::connect("127.0.0.1", port, 0, 2, Duration::from_secs(1)).unwrap();
    assert!(server.is_server());
    let t0 = Instant::now();
    let e = server.get("never", Duration::from_millis(150)).unwrap_err();
    assert!(matches!(e, CommError::StoreTimeout { .. }), "{e}");
    assert!(t0.elapsed() >= Duration::from_millis(150));

    // A rank of a job of another size, and a second process claiming rank 0.
    let e = TcpStore::connect("127.0.0.1", port, 1, 3, Duration::from_secs(10)).unwrap_err();
    assert!(
        matches!(
            e,
            CommError::WorldSizeMismatch {
                ours: 3,
                theirs: 2,
                ..
            }
        ),
        "{e}"
    );
    let one = TcpStore::connect("127.0.0.1", port, 1, 2, Duration::from_secs(10)).unwrap();
    let e = TcpStore::connect("127.0.0.1", port, 1, 2, Duration::from_secs(10)).unwrap_err();
    assert!(e.to_string().contains("rank 1 is already connected"), "{e}");
    assert_eq!(one.add("n", 2).unwrap(), 2);
    assert_eq!(server.add("n", 3).unwrap(), 5);

    // A published root info of another world size.
    server.set("default/root", &8u64.to_le_bytes()).unwrap();
    let rdzv = Rendezvous::Tcp {
        store: std::sync::Arc::new(one),
        prefix: "default".into(),
    };
    let e = rdzv.wait(2, 0, Duration::from_secs(1)).unwrap_err();
    assert!(
        matches!(
            e,
            CommError::WorldSizeMismatch {
                ours: 2,
                theirs: 8,
                ..
            }
        ),
        "{e}"
    );

    // Rank 0 leaves while rank 1 is still connected: it lingers for its timeout, then the
    // others' requests fail instead of hanging.
    let t0 = Instant::now();
    drop(server);
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t0.elapsed()
    );
    let e = rdzv.wait(2, 0, Duration::from_secs(1)).unwrap_err();
    assert!(matches!(e, CommError::Store { .. }), "{e}");
}

#[test]
fn rendezvous_variables_are_checked() {
    let t = Duration::from_secs(1);
    let with = |vars: &'static [(&'static str, &'static str)]| {
        Rendezvous::from_lookup(
            |k| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            },
            &dist(1, 2),
            t,
        )
    };
    let e = with(&[]).unwrap_err();
    assert!(
        matches!(
            e,
            CommError::Env {
                var: "MASTER_ADDR",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("CANNON_RDZV_DIR"), "{e}");
    let e = with(&[("MASTER_ADDR", "127.0.0.1")]).unwrap_err();
    assert!(
        matches!(
            e,
            CommError::Env {
                var: "MASTER_PORT",
                ..
            }
        ),
        "{e}"
    );
    let e = with(&[("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "http")]).unwrap_err();
    assert!(
        e.to_string().contains("\"http\" is not a port number"),
        "{e}"
    );
    let e = with(&[("MASTER_PORT", "29500")]).unwrap_err();
    assert!(
        matches!(
            e,
            CommError::Env {
                var: "MASTER_ADDR",
                ..
            }
        ),
        "{e}"
    );
    // A shared directory wins over the store (no connection is made).
    let f = with(&[
        ("CANNON_RDZV_DIR", "/tmp/x"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "1"),
    ])
    .unwrap();
    assert!(matches!(f, Rendezvous::File(_)));
}
