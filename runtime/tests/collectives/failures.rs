//! Failures: ranks that drop out (dropped communicator, or never calling), calls that do not
//! match, bad arguments on one rank, and the poisoned state afterwards. Each must be an error on
//! every rank involved, quickly, never a hang and never silently wrong numbers.

use std::time::{Duration, Instant};

use cannon_runtime::comm::{CommError, ReduceOp};

use crate::common::*;

const SHORT: Duration = Duration::from_millis(200);
/// Upper bound for "fails fast": far below GENEROUS (the timeout those tests run with), far
/// above scheduling noise on a loaded 2-core machine.
const FAST: Duration = Duration::from_secs(3);

#[test]
fn dropped_communicator_fails_peers_fast() {
    let out = run_world(3, GENEROUS, |c| {
        if c.rank() == 2 {
            drop(c);
            return None;
        }
        // Give rank 2 time to drop first in most runs; either order must fail fast.
        std::thread::sleep(Duration::from_millis(20));
        let t = Instant::now();
        let mut x = vec![1.0f32; 4];
        let e = c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap_err();
        Some((e, t.elapsed()))
    });
    for (e, took) in out.into_iter().flatten() {
        assert!(took < FAST, "took {took:?}");
        match e {
            CommError::PeerDropped {
                op: "all_reduce",
                dropped,
                ..
            } => assert_eq!(dropped, [2]),
            other => panic!("expected PeerDropped, got {other}"),
        }
    }
}

#[test]
fn dropped_while_peers_wait() {
    // Ranks 0 and 1 are already blocked in all_gather when rank 2 drops its communicator.
    let out = run_world(3, GENEROUS, |c| {
        if c.rank() == 2 {
            std::thread::sleep(Duration::from_millis(100));
            drop(c);
            return None;
        }
        let t = Instant::now();
        let mut recv = vec![0.0f64; 6];
        let e = c.all_gather(&[1.0, 2.0], &mut recv).unwrap_err();
        Some((e, t.elapsed()))
    });
    for (e, took) in out.into_iter().flatten() {
        assert!(took < FAST, "took {took:?}");
        assert!(
            matches!(&e, CommError::PeerDropped { op: "all_gather", dropped, .. } if dropped == &[2]),
            "{e}"
        );
        assert!(e.to_string().contains("rank(s) [2] dropped"), "{e}");
    }
}

#[test]
fn rank_that_never_arrives_times_out() {
    let out = run_world(4, SHORT, |c| {
        if c.rank() == 3 {
            // Alive but busy elsewhere: keeps its communicator past everyone's timeout. When it
            // finally arrives, the collective it joins is the failed one; after that, poisoned.
            std::thread::sleep(SHORT * 3);
            let late = c.barrier().unwrap_err();
            let after = c.barrier().unwrap_err();
            return (late, Some(after));
        }
        let t = Instant::now();
        let send = vec![1i32; 8];
        let mut recv = vec![0i32; 2];
        let e = c
            .reduce_scatter(&send, &mut recv, ReduceOp::Max)
            .unwrap_err();
        // The first rank to time out fails the group; later arrivals learn it sooner.
        assert!(t.elapsed() < FAST, "took {:?}", t.elapsed());
        (e, None)
    });
    for (rank, (e, _)) in out.iter().enumerate() {
        match e {
            CommError::Timeout {
                op,
                missing,
                world_size,
                timeout,
                waited,
                ..
            } => {
                assert_eq!(
                    (*op, missing.as_slice(), *world_size),
                    ("reduce_scatter", &[3][..], 4)
                );
                assert!(*timeout == SHORT && *waited >= SHORT, "{waited:?}");
            }
            other => panic!("rank {rank}: expected Timeout, got {other}"),
        }
        let msg = e.to_string();
        assert!(
            msg.contains("reduce_scatter") && msg.contains("[3]") && msg.contains("200ms"),
            "{msg}"
        );
    }
    let after = out[3].1.clone().unwrap();
    assert!(
        matches!(&after, CommError::Poisoned { op: "barrier", cause } if cause.contains("reduce_scatter")),
        "{after}"
    );
}

#[test]
fn per_call_timeout_overrides_the_world_timeout() {
    let out = run_world(2, GENEROUS, |c| {
        if c.rank() == 1 {
            std::thread::sleep(Duration::from_millis(400));
            return None;
        }
        let t = Instant::now();
        let e = c
            .with_timeout(Duration::from_millis(50), |c| c.barrier())
            .unwrap_err();
        assert_eq!(c.timeout(), GENEROUS, "with_timeout restores the timeout");
        Some((e, t.elapsed()))
    });
    let (e, took) = out[0].clone().unwrap();
    assert!(matches!(e, CommError::Timeout { op: "barrier", .. }), "{e}");
    assert!(
        took >= Duration::from_millis(50) && took < Duration::from_millis(390),
        "{took:?}"
    );
}

#[test]
fn mismatched_counts_ops_dtypes_and_collectives_are_errors() {
    type Call = fn(&Rank) -> Result<(), CommError>;
    let cases: [(Call, Call, &str); 4] = [
        (
            |c| c.all_reduce_in_place(&mut [0.0f32; 10], ReduceOp::Sum),
            |c| c.all_reduce_in_place(&mut [0.0f32; 12], ReduceOp::Sum),
            "count 10",
        ),
        (
            |c| c.all_reduce_in_place(&mut [0.0f32; 10], ReduceOp::Sum),
            |c| c.all_reduce_in_place(&mut [0.0f32; 10], ReduceOp::Max),
            "Max",
        ),
        (
            |c| c.broadcast(&mut [0.0f32; 4], 0),
            |c| c.broadcast(&mut [0i32; 4], 0),
            "i32",
        ),
        (
            |c| c.broadcast(&mut [0.0f32; 4], 0),
            |c| c.barrier(),
            "barrier",
        ),
    ];
    for (a, b, needle) in cases {
        let out = run_world(2, GENEROUS, |c| {
            let e = if c.rank() == 0 { a(&c) } else { b(&c) }.unwrap_err();
            // Afterwards the group is poisoned: a clean error, naming the cause.
            let after = c.barrier().unwrap_err();
            (e, after)
        });
        for (e, after) in out {
            assert!(matches!(e, CommError::Mismatch { .. }), "{e}");
            assert!(e.to_string().contains(needle), "{e} lacks {needle}");
            assert!(
                matches!(&after, CommError::Poisoned { op: "barrier", cause } if cause.contains(needle)),
                "{after}"
            );
        }
    }
}

#[test]
fn bad_length_on_one_rank_fails_every_rank_fast() {
    let out = run_world(3, GENEROUS, |c| {
        let t = Instant::now();
        let send = vec![1.0f32; 5];
        let mut recv = vec![0.0f32; if c.rank() == 1 { 4 } else { 5 }];
        let e = c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap_err();
        (e, t.elapsed())
    });
    for (e, took) in out {
        assert!(took < FAST, "took {took:?}");
        // Rank 1 reports its own mistake; the others either get the same error (they were
        // waiting) or learn of it as the cause of the poisoned group (they arrived later).
        let msg = e.to_string();
        assert!(
            msg.contains("rank 1: recv has 4 elements, expected 5"),
            "{msg}"
        );
    }
}

#[test]
fn invalid_ranks_are_errors() {
    let out = run_world(2, GENEROUS, |c| {
        let a = c.broadcast(&mut [0.0f32; 2], 2).unwrap_err();
        let b = c.send(&[1.0f32], 5).unwrap_err();
        (a, b)
    });
    for (a, b) in out {
        assert!(
            matches!(
                a,
                CommError::InvalidRank {
                    op: "broadcast",
                    rank: 2,
                    world_size: 2
                }
            ),
            "{a}"
        );
        assert!(
            matches!(
                b,
                CommError::InvalidRank {
                    op: "send",
                    rank: 5,
                    ..
                }
            ),
            "{b}"
        );
    }
}

#[test]
fn recv_failures() {
    // No sender: a timeout naming the source. Wrong length: a mismatch naming both sides.
    let out = run_world(2, SHORT, |c| {
        if c.rank() == 0 {
            let e = c.recv(&mut [0.0f32; 3], 1).unwrap_err();
            return Some(e);
        }
        std::thread::sleep(SHORT * 2);
        None
    });
    let e = out[0].clone().unwrap();
    assert!(
        matches!(&e, CommError::Timeout { op: "recv", missing, .. } if missing == &[1]),
        "{e}"
    );

    let out = run_world(2, GENEROUS, |c| {
        if c.rank() == 0 {
            c.send(&[1.0f32, 2.0], 1).unwrap();
            None
        } else {
            Some(c.recv(&mut [0.0f32; 3], 0).unwrap_err())
        }
    });
    let e = out[1].clone().unwrap();
    assert!(
        e.to_string()
            .contains("rank 0 sent 2 f32 elements but rank 1 receives 3 f32"),
        "{e}"
    );

    // A dropped sender whose messages were all consumed: PeerDropped, at once.
    let out = run_world(2, GENEROUS, |c| {
        if c.rank() == 0 {
            c.send(&[7i64], 1).unwrap();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
        let mut got = [0i64];
        c.recv(&mut got, 0).unwrap();
        let t = Instant::now();
        let e = c.recv(&mut got, 0).unwrap_err();
        Some((got[0], e, t.elapsed()))
    });
    let (got, e, took) = out[1].clone().unwrap();
    assert_eq!(got, 7);
    assert!(took < FAST, "{took:?}");
    assert!(
        matches!(&e, CommError::PeerDropped { op: "recv", dropped, .. } if dropped == &[0]),
        "{e}"
    );
}
