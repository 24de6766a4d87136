//! Group splits (the dp x cp mesh), point-to-point rings, and barrier.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cannon_runtime::comm::{CommError, ReduceOp};

use crate::common::*;

#[test]
fn split_eight_ranks_into_2x4_and_4x2() {
    // The trainer's mesh: cp groups are contiguous (color = rank / cp), dp groups strided
    // (color = rank % cp). Both splits of one world, used interleaved.
    for cp in [4usize, 2] {
        let out = run_world(8, GENEROUS, |c| {
            let r = c.rank();
            let cp_group = c.split((r / cp) as u32, r as u32).unwrap();
            let dp_group = c.split((r % cp) as u32, r as u32).unwrap();
            assert_eq!((cp_group.world_size(), cp_group.rank()), (cp, r % cp));
            assert_eq!((dp_group.world_size(), dp_group.rank()), (8 / cp, r / cp));

            // Sum of world ranks within each group, and a gather showing the members' order.
            let mut s = vec![r as i64];
            cp_group.all_reduce_in_place(&mut s, ReduceOp::Sum).unwrap();
            let mut members = vec![0i64; 8 / cp];
            dp_group.all_gather(&[r as i64], &mut members).unwrap();
            // The parent still works alongside its subgroups.
            let mut total = vec![1.0f32];
            c.all_reduce_in_place(&mut total, ReduceOp::Sum).unwrap();
            (s[0], members, total[0])
        });
        for (r, (s, members, total)) in out.into_iter().enumerate() {
            let base = r / cp * cp;
            assert_eq!(s, (base..base + cp).sum::<usize>() as i64);
            let want: Vec<i64> = (0..8 / cp).map(|k| (r % cp + k * cp) as i64).collect();
            assert_eq!(members, want);
            assert_eq!(total, 8.0);
        }
    }
}

#[test]
fn split_orders_by_key_then_rank() {
    // Keys reverse the order; equal keys fall back to the old rank.
    let out = run_world(6, GENEROUS, |c| {
        let r = c.rank();
        let rev = c.split(0, (10 - r) as u32).unwrap();
        let tied = c.split((r % 2) as u32, 0).unwrap();
        (rev.rank(), tied.rank(), tied.world_size())
    });
    for (r, (rev, tied, size)) in out.into_iter().enumerate() {
        assert_eq!(rev, 5 - r);
        assert_eq!((tied, size), (r / 2, 3));
    }
}

#[test]
fn dropped_member_fails_only_its_subgroup() {
    let out = run_world(4, GENEROUS, |c| {
        let r = c.rank();
        let sub = c.split((r / 2) as u32, 0).unwrap();
        if r == 3 {
            drop(sub);
            return None;
        }
        let mut x = vec![1.0f64];
        Some(sub.all_reduce_in_place(&mut x, ReduceOp::Sum).map(|_| x[0]))
    });
    assert_eq!(out[0], Some(Ok(2.0)));
    assert_eq!(out[1], Some(Ok(2.0)));
    match &out[2] {
        Some(Err(CommError::PeerDropped { dropped, .. })) => assert_eq!(dropped, &[1]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn ring_exchange() {
    // ModelPass every rank's block around the ring: after n-1 steps each rank has seen all blocks,
    // once with send/recv (eager sends cannot deadlock the ring) and once with send_recv.
    for world in WORLDS {
        let out = run_world(world, GENEROUS, |c| {
            let r = c.rank();
            let (next, prev) = ((r + 1) % world, (r + world - 1) % world);
            let mut block = input::<f32>(3, r, 5);
            let mut seen = vec![block.clone()];
            for step in 1..world {
                let mut incoming = vec![0.0f32; 5];
                if step % 2 == 0 {
                    c.send(&block, next).unwrap();
                    c.recv(&mut incoming, prev).unwrap();
                } else {
                    c.send_recv(&block, next, &mut incoming, prev).unwrap();
                }
                block = incoming;
                seen.push(block.clone());
            }
            seen
        });
        for (r, seen) in out.into_iter().enumerate() {
            for (step, block) in seen.into_iter().enumerate() {
                assert_eq!(block, input::<f32>(3, (r + world - step) % world, 5));
            }
        }
    }
}

#[test]
fn messages_between_a_pair_arrive_in_order() {
    let out = run_world(2, GENEROUS, |c| {
        if c.rank() == 0 {
            for k in 0..5i32 {
                c.send(&vec![k; k as usize + 1], 1).unwrap();
            }
            c.send(&[0.5f64], 0).unwrap(); // to itself
            let mut own = [0.0f64];
            c.recv(&mut own, 0).unwrap();
            assert_eq!(own, [0.5]);
            Vec::new()
        } else {
            (0..5)
                .map(|k| {
                    let mut b = vec![0i32; k + 1];
                    c.recv(&mut b, 0).unwrap();
                    b
                })
                .collect()
        }
    });
    let want: Vec<Vec<i32>> = (0..5).map(|k| vec![k as i32; k + 1]).collect();
    assert_eq!(out[1], want);
}

#[test]
fn barrier_waits_for_everyone() {
    for world in WORLDS {
        let arrived = AtomicUsize::new(0);
        run_world(world, GENEROUS, |c| {
            for round in 1..=3 {
                // Stagger the ranks so that a barrier that does not wait would be caught.
                std::thread::sleep(Duration::from_millis(((c.rank() * 7 + round) % 5) as u64));
                arrived.fetch_add(1, Ordering::SeqCst);
                c.barrier().unwrap();
                assert!(arrived.load(Ordering::SeqCst) >= round * world);
                c.barrier().unwrap();
            }
        });
    }
}
