//! all_gather(_v), broadcast and all_to_all(_v) against the sequential layout, on 1, 2, 3, 4
//! and 8 ranks and every dtype. These move data without arithmetic, so results are exact.

use cannon_runtime::comm::{even_counts, CommError, ReduceOp};
use cannon_runtime::DeviceBuffer;

use crate::common::*;

fn all_gather_case<T: TestElem>() {
    for world in WORLDS {
        run_world(world, GENEROUS, |c| {
            let r = c.rank();
            for n in [0usize, 1, 7, 3000] {
                let send = input::<T>(n as u64, r, n);
                let mut recv = vec![T::gen(1, 1, 1); n * world];
                c.all_gather(&send, &mut recv).unwrap();
                let want: Vec<T> = (0..world)
                    .flat_map(|j| input::<T>(n as u64, j, n))
                    .collect();
                assert_eq!(recv, want, "all_gather n={n} world={world} rank={r}");
            }
            let skewed: Vec<usize> = (0..world).map(|j| (j * 3) % 4).collect();
            for counts in [even_counts(7, world), even_counts(5000, world), skewed] {
                let send = input::<T>(9, r, counts[r]);
                let mut recv = vec![T::gen(1, 1, 1); counts.iter().sum()];
                c.all_gather_v(&send, &mut recv, &counts).unwrap();
                let want: Vec<T> = (0..world)
                    .flat_map(|j| input::<T>(9, j, counts[j]))
                    .collect();
                assert_eq!(recv, want, "all_gather_v {counts:?} rank={r}");
            }
        });
    }
}

fn broadcast_case<T: TestElem>() {
    for world in WORLDS {
        run_world(world, GENEROUS, |c| {
            let r = c.rank();
            for root in [0, world - 1, world / 2] {
                for n in [0usize, 5, 2000] {
                    let mut buf = input::<T>(root as u64, r, n);
                    c.broadcast(&mut buf, root).unwrap();
                    assert_eq!(buf, input::<T>(root as u64, root, n), "root={root} n={n}");
                }
            }
        });
    }
}

fn all_to_all_case<T: TestElem>() {
    for world in WORLDS {
        run_world(world, GENEROUS, |c| {
            let r = c.rank();
            // Element k of chunk j of rank i's send is gen(seed, i, j * chunk + k).
            for chunk in [0usize, 1, 4, 700] {
                let send = input::<T>(chunk as u64, r, chunk * world);
                let mut recv = vec![T::gen(1, 1, 1); chunk * world];
                c.all_to_all(&send, &mut recv).unwrap();
                let want: Vec<T> = (0..world)
                    .flat_map(|j| (0..chunk).map(move |k| T::gen(chunk as u64, j, r * chunk + k)))
                    .collect();
                assert_eq!(
                    recv, want,
                    "all_to_all chunk={chunk} world={world} rank={r}"
                );
            }
            // Uneven: rank i sends count(i, j) elements to rank j, some of them zero.
            let count = |i: usize, j: usize| (i + 2 * j) % 3 + (i == j) as usize * 2;
            let send_counts: Vec<usize> = (0..world).map(|j| count(r, j)).collect();
            let recv_counts: Vec<usize> = (0..world).map(|j| count(j, r)).collect();
            let send = input::<T>(77, r, send_counts.iter().sum());
            let mut recv = vec![T::gen(1, 1, 1); recv_counts.iter().sum()];
            c.all_to_all_v(&send, &send_counts, &mut recv, &recv_counts)
                .unwrap();
            let want: Vec<T> = (0..world)
                .flat_map(|j| {
                    let off: usize = (0..r).map(|k| count(j, k)).sum();
                    (0..count(j, r)).map(move |k| T::gen(77, j, off + k))
                })
                .collect();
            assert_eq!(recv, want, "all_to_all_v world={world} rank={r}");
        });
    }
}

macro_rules! per_dtype {
    ($name:ident, $case:ident) => {
        mod $name {
            use super::*;
            #[test]
            fn f32() {
                $case::<f32>()
            }
            #[test]
            fn bf16() {
                $case::<half::bf16>()
            }
            #[test]
            fn f64() {
                $case::<f64>()
            }
            #[test]
            fn i32() {
                $case::<i32>()
            }
            #[test]
            fn i64() {
                $case::<i64>()
            }
        }
    };
}

per_dtype!(all_gather, all_gather_case);
per_dtype!(broadcast, broadcast_case);
per_dtype!(all_to_all, all_to_all_case);

#[test]
fn all_to_all_needs_divisible_buffers() {
    for e in run_world(3, GENEROUS, |c| {
        c.all_to_all(&[1.0f32; 7], &mut [0.0; 7]).unwrap_err()
    }) {
        assert_eq!(
            e,
            CommError::NotDivisible {
                op: "all_to_all",
                len: 7,
                world_size: 3
            }
        );
    }
}

#[test]
fn all_to_all_v_counts_must_agree_across_ranks() {
    // Rank 0 sends 2 elements to rank 1, which expects 3 from it: an error on both ranks.
    let out = run_world(2, GENEROUS, |c| {
        let (sc, rc) = if c.rank() == 0 {
            ([1, 2], [1, 1])
        } else {
            ([1, 1], [3, 1])
        };
        let send = vec![0i32; sc.iter().sum()];
        let mut recv = vec![0i32; rc.iter().sum()];
        c.all_to_all_v(&send, &sc, &mut recv, &rc).unwrap_err()
    });
    for e in out {
        assert!(
            matches!(
                e,
                CommError::Mismatch {
                    op: "all_to_all_v",
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("rank 0 sends Some(2) elements to rank 1"),
            "{e}"
        );
    }
}

#[test]
fn sub_views_at_offsets() {
    // The interface works on views: gather from the middle of one buffer into the middle of
    // another, and reduce in place inside a window, leaving everything around them untouched.
    let out = run_world(3, GENEROUS, |c| {
        let (s, r) = (&c.stream, c.rank() as f32);
        let src = DeviceBuffer::clone_htod(s, &[-1.0, r, r + 0.5, -1.0]).unwrap();
        let mut dst = DeviceBuffer::clone_htod(s, &[9.0f32; 10]).unwrap();
        c.comm
            .all_gather(
                &src.slice(1..3).unwrap(),
                &mut dst.slice_mut(2..8).unwrap(),
                s,
            )
            .unwrap();
        let mut acc = DeviceBuffer::clone_htod(s, &[7i32, r as i32, 1, 7]).unwrap();
        c.comm
            .all_reduce_in_place(&mut acc.slice_mut(1..3).unwrap(), ReduceOp::Sum, s)
            .unwrap();
        (dst.clone_dtoh(s).unwrap(), acc.clone_dtoh(s).unwrap())
    });
    for (gathered, reduced) in out {
        assert_eq!(gathered, [9.0, 9.0, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 9.0, 9.0]);
        assert_eq!(reduced, [7, 3, 3, 7]);
    }
}

#[test]
fn a_recv_view_of_the_wrong_length_is_an_error_not_a_panic() {
    // Lengths are checked per rank against the views, on every rank.
    let out = run_world(2, GENEROUS, |c| {
        let s = &c.stream;
        let send = DeviceBuffer::clone_htod(s, &[1.0f64; 3]).unwrap();
        let mut recv = DeviceBuffer::<f64>::alloc(s, 5).unwrap();
        c.comm
            .all_gather(&send.view(), &mut recv.view_mut(), s)
            .unwrap_err()
    });
    for e in out {
        assert!(
            e.to_string().contains("recv has 5 elements, expected 6"),
            "{e}"
        );
    }
}
