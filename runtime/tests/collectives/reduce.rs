//! all_reduce, reduce_scatter and reduce_scatter_v against the sequential reference, on 1, 2, 3,
//! 4 and 8 ranks, every dtype and reduce op. Comparisons are exact: the communicator combines
//! ranks in rank order with the same IEEE operations as the reference (bf16: f32 accumulation,
//! one rounding), so any difference is a bug, not rounding noise.

use cannon_runtime::comm::{even_counts, CommError, ReduceOp};

use crate::common::*;

/// Sizes: empty, tiny, uneven over 3 and 8 ranks, and over the 1024-element reduction block
/// within one rank's chunk even on 8 ranks.
const SIZES: [usize; 5] = [0, 1, 7, 1000, 9001];

fn all_reduce_case<T: TestElem>() {
    for world in WORLDS {
        run_world(world, GENEROUS, |c| {
            let r = c.rank();
            for (s, &n) in SIZES.iter().enumerate() {
                for (o, op) in ops::<T>().into_iter().enumerate() {
                    let seed = (s * 10 + o) as u64;
                    let send = input::<T>(seed, r, n);
                    let want: Vec<T> = (0..n).map(|i| reduced(seed, world, op, i)).collect();

                    let mut recv = input::<T>(seed + 999, r, n);
                    c.all_reduce(&send, &mut recv, op).unwrap();
                    assert_eq!(recv, want, "all_reduce {op:?} n={n} world={world} rank={r}");

                    let mut buf = send.clone();
                    c.all_reduce_in_place(&mut buf, op).unwrap();
                    assert_eq!(buf, want, "all_reduce_in_place {op:?} n={n} world={world}");
                }
            }
        });
    }
}

fn reduce_scatter_case<T: TestElem>() {
    for world in WORLDS {
        run_world(world, GENEROUS, |c| {
            let r = c.rank();
            for m in [0usize, 1, 3, 1500] {
                for op in ops::<T>() {
                    let seed = 100 + m as u64;
                    let send = input::<T>(seed, r, m * world);
                    let mut recv = vec![T::gen(7, 7, 7); m];
                    c.reduce_scatter(&send, &mut recv, op).unwrap();
                    let want: Vec<T> = (0..m)
                        .map(|i| reduced(seed, world, op, r * m + i))
                        .collect();
                    assert_eq!(
                        recv, want,
                        "reduce_scatter {op:?} m={m} world={world} rank={r}"
                    );
                }
            }
            // Uneven flat shards (FSDP): the near-equal split, and one with empty shards.
            let skewed: Vec<usize> = (0..world)
                .map(|j| if j % 2 == 0 { 0 } else { 5 + j })
                .collect();
            for counts in [even_counts(7, world), even_counts(2049, world), skewed] {
                for op in ops::<T>() {
                    let total: usize = counts.iter().sum();
                    let off: usize = counts[..r].iter().sum();
                    let seed = 200 + total as u64;
                    let send = input::<T>(seed, r, total);
                    let mut recv = vec![T::gen(7, 7, 7); counts[r]];
                    c.reduce_scatter_v(&send, &mut recv, &counts, op).unwrap();
                    let want: Vec<T> = (0..counts[r])
                        .map(|i| reduced(seed, world, op, off + i))
                        .collect();
                    assert_eq!(recv, want, "reduce_scatter_v {op:?} {counts:?} rank={r}");
                }
            }
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

per_dtype!(all_reduce, all_reduce_case);
per_dtype!(reduce_scatter, reduce_scatter_case);

#[test]
fn seven_elements_on_three_ranks() {
    // all_reduce has no divisibility requirement; reduce_scatter does, and says so on every
    // rank; reduce_scatter_v handles the same buffer.
    let out = run_world(3, GENEROUS, |c| {
        let r = c.rank();
        let send = input::<f32>(5, r, 7);
        let mut all = vec![0.0f32; 7];
        c.all_reduce(&send, &mut all, ReduceOp::Sum).unwrap();
        let want: Vec<f32> = (0..7).map(|i| reduced(5, 3, ReduceOp::Sum, i)).collect();
        assert_eq!(all, want);

        let counts = even_counts(7, 3);
        assert_eq!(counts, vec![3, 2, 2]);
        let mut shard = vec![0.0f32; counts[r]];
        c.reduce_scatter_v(&send, &mut shard, &counts, ReduceOp::Sum)
            .unwrap();
        let off: usize = counts[..r].iter().sum();
        assert_eq!(shard, want[off..off + counts[r]]);

        let mut recv = vec![0.0f32; 2];
        c.reduce_scatter(&send, &mut recv, ReduceOp::Sum)
            .unwrap_err()
    });
    for e in out {
        assert_eq!(
            e,
            CommError::NotDivisible {
                op: "reduce_scatter",
                len: 7,
                world_size: 3
            }
        );
        assert!(e.to_string().contains("_v variant"), "{e}");
    }
}

#[test]
fn integer_average_is_rejected_on_every_rank() {
    let out = run_world(2, GENEROUS, |c| {
        let mut buf = vec![1i64, 2, 3];
        c.all_reduce_in_place(&mut buf, ReduceOp::Avg).unwrap_err()
    });
    for e in out {
        assert!(
            matches!(
                e,
                CommError::UnsupportedReduce {
                    reduce_op: ReduceOp::Avg,
                    ..
                }
            ),
            "{e}"
        );
    }
}

#[test]
fn bf16_sum_rounds_once() {
    // 1 + 8 * 2^-9: each 2^-9 alone is below half an ulp of 1 in bf16 (ulp 2^-7), so rounding
    // after every addition would give 1.0; accumulating in f32 gives 1 + 2^-6 exactly.
    use half::bf16;
    let out = run_world(9, GENEROUS, |c| {
        let v = if c.rank() == 0 { 1.0 } else { 2f32.powi(-9) };
        let mut buf = vec![bf16::from_f32(v)];
        c.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
        buf[0]
    });
    for v in out {
        assert_eq!(v, bf16::from_f32(1.0 + 2f32.powi(-6)));
    }
}

#[test]
fn max_and_min_propagate_nan() {
    let out = run_world(3, GENEROUS, |c| {
        let v = if c.rank() == 1 {
            f32::NAN
        } else {
            c.rank() as f32
        };
        let mut mx = vec![v];
        let mut mn = vec![v];
        c.all_reduce_in_place(&mut mx, ReduceOp::Max).unwrap();
        c.all_reduce_in_place(&mut mn, ReduceOp::Min).unwrap();
        (mx[0], mn[0])
    });
    for (mx, mn) in out {
        assert!(mx.is_nan() && mn.is_nan(), "{mx} {mn}");
    }
}

#[test]
fn many_rounds_back_to_back() {
    // 300 small collectives in a row: the round/stage protocol must not mix up rounds when fast
    // ranks race ahead.
    run_world(4, GENEROUS, |c| {
        for k in 0..300i64 {
            let mut x = vec![k * 10 + c.rank() as i64];
            c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
            assert_eq!(x[0], 4 * k * 10 + 6);
        }
    });
}

#[test]
fn unbounded_timeout_is_accepted() {
    // Duration::MAX cannot be added to an Instant; it must mean "wait for ever", not panic.
    let out = run_world(3, std::time::Duration::MAX, |c| {
        let mut x = vec![c.rank() as i32];
        c.all_reduce_in_place(&mut x, ReduceOp::Max).unwrap();
        c.barrier().unwrap();
        x[0]
    });
    assert_eq!(out, vec![2, 2, 2]);
}
