//! Reduce ops shared by the CPU and HCCL communicators, and the CPU reductions per element type.
//!
//! Reductions run block-wise through an accumulator type: bf16 accumulates in f32 and is rounded
//! once when stored (so a sum over 8 ranks is one rounding, not 7), everything else accumulates in
//! its own type. Ranks are combined in rank order 0, 1, ..., n-1, so the result is bitwise
//! deterministic and independent of which rank reduces which slice.

use half::bf16;

/// Reduce operations. `Avg` is the sum divided by the group size (float types only).
///
/// A leaf of `comm`: [`CommError`](super::CommError) names a reduce op, so the check that
/// refuses one for a dtype, [`ReduceOp::check`], is defined beside the error (error.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
    Avg,
}

impl ReduceOp {
    /// The `HcclReduceOp` enum value (SUM=0, MAX=2, MIN=3); `Avg` has none.
    pub fn hccl_code(self) -> Option<u32> {
        match self {
            ReduceOp::Sum => Some(0),
            ReduceOp::Max => Some(2),
            ReduceOp::Min => Some(3),
            ReduceOp::Avg => None,
        }
    }
}

/// How the CPU communicator reduces one element type (crate-private: the public element trait
/// is [`crate::Element`]; collectives reach these impls by dispatching on the agreed `DType`,
/// see `cpu/exec.rs`). One impl per `DType`, for the Rust type that `DType` names.
pub(crate) trait Reduce: crate::Element {
    /// What a reduction accumulates in.
    type Acc: Copy + Default;

    /// `acc[i] = src[i]` (the contribution of rank 0). Lengths are equal.
    fn load(acc: &mut [Self::Acc], src: &[Self]);
    /// `acc[i] = op(acc[i], src[i])`; `Avg` combines like `Sum`. Lengths are equal.
    fn combine(op: ReduceOp, acc: &mut [Self::Acc], src: &[Self]);
    /// `dst[i] = acc[i]`, divided by `avg_over` when set (one rounding for bf16).
    fn store(acc: &[Self::Acc], dst: &mut [Self], avg_over: Option<usize>);
}

/// max/min that propagate NaN (a diverged rank must be visible in the reduced value).
macro_rules! float_max_min {
    ($t:ty) => {
        #[inline(always)]
        pub(super) fn fmax(a: $t, b: $t) -> $t {
            if b.is_nan() || b > a {
                b
            } else {
                a
            }
        }
        #[inline(always)]
        pub(super) fn fmin(a: $t, b: $t) -> $t {
            if b.is_nan() || b < a {
                b
            } else {
                a
            }
        }
    };
}

mod fops32 {
    float_max_min!(f32);
}
mod fops64 {
    float_max_min!(f64);
}

macro_rules! impl_float {
    ($t:ty, $ops:ident) => {
        impl Reduce for $t {
            type Acc = $t;

            fn load(acc: &mut [$t], src: &[$t]) {
                acc.copy_from_slice(src);
            }

            fn combine(op: ReduceOp, acc: &mut [$t], src: &[$t]) {
                // One loop per op so each one vectorises.
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => {
                        acc.iter_mut().zip(src).for_each(|(a, &b)| *a += b)
                    }
                    ReduceOp::Max => acc
                        .iter_mut()
                        .zip(src)
                        .for_each(|(a, &b)| *a = $ops::fmax(*a, b)),
                    ReduceOp::Min => acc
                        .iter_mut()
                        .zip(src)
                        .for_each(|(a, &b)| *a = $ops::fmin(*a, b)),
                }
            }

            fn store(acc: &[$t], dst: &mut [$t], avg_over: Option<usize>) {
                match avg_over {
                    None => dst.copy_from_slice(acc),
                    Some(n) => {
                        let n = n as $t;
                        dst.iter_mut().zip(acc).for_each(|(d, &a)| *d = a / n)
                    }
                }
            }
        }
    };
}

impl_float!(f32, fops32);
impl_float!(f64, fops64);

impl Reduce for bf16 {
    type Acc = f32;

    fn load(acc: &mut [f32], src: &[bf16]) {
        acc.iter_mut().zip(src).for_each(|(a, b)| *a = b.to_f32());
    }

    fn combine(op: ReduceOp, acc: &mut [f32], src: &[bf16]) {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => {
                acc.iter_mut().zip(src).for_each(|(a, b)| *a += b.to_f32())
            }
            ReduceOp::Max => acc
                .iter_mut()
                .zip(src)
                .for_each(|(a, b)| *a = fops32::fmax(*a, b.to_f32())),
            ReduceOp::Min => acc
                .iter_mut()
                .zip(src)
                .for_each(|(a, b)| *a = fops32::fmin(*a, b.to_f32())),
        }
    }

    fn store(acc: &[f32], dst: &mut [bf16], avg_over: Option<usize>) {
        match avg_over {
            None => dst
                .iter_mut()
                .zip(acc)
                .for_each(|(d, &a)| *d = crate::dtype::f32_to_bf16(a)),
            Some(n) => {
                let n = n as f32;
                dst.iter_mut()
                    .zip(acc)
                    .for_each(|(d, &a)| *d = crate::dtype::f32_to_bf16(a / n))
            }
        }
    }
}

macro_rules! impl_int {
    ($t:ty) => {
        impl Reduce for $t {
            type Acc = $t;

            fn load(acc: &mut [$t], src: &[$t]) {
                acc.copy_from_slice(src);
            }

            fn combine(op: ReduceOp, acc: &mut [$t], src: &[$t]) {
                // Sums wrap (as HCCL's do) rather than panic in debug builds.
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => acc
                        .iter_mut()
                        .zip(src)
                        .for_each(|(a, &b)| *a = a.wrapping_add(b)),
                    ReduceOp::Max => acc.iter_mut().zip(src).for_each(|(a, &b)| *a = (*a).max(b)),
                    ReduceOp::Min => acc.iter_mut().zip(src).for_each(|(a, &b)| *a = (*a).min(b)),
                }
            }

            fn store(acc: &[$t], dst: &mut [$t], avg_over: Option<usize>) {
                // `ReduceOp::check` rejects Avg for integers before any data moves; should a
                // caller bypass it the truncating quotient is still well defined.
                match avg_over {
                    None => dst.copy_from_slice(acc),
                    Some(n) => {
                        let n = n as $t;
                        dst.iter_mut()
                            .zip(acc)
                            .for_each(|(d, &a)| *d = a.wrapping_div(n))
                    }
                }
            }
        }
    };
}

impl_int!(i32);
impl_int!(i64);
impl_int!(u32);
impl_int!(u8);
