//! The data movement of the CPU collectives: each rank reads its peers' buffers directly through
//! the addresses they posted. This is the only file of the CPU communicator with `unsafe`.
//!
//! Why reading a peer's memory is sound (see group.rs for the round protocol):
//! - A rank posts `RawBufs` derived from the `&[T]`/`&mut [T]` it was called with, then never
//!   touches those references again until the call returns; all accesses go through the raw
//!   pointers, and each access creates a slice over only the range it touches, for only as long
//!   as that access lasts.
//! - The call does not return before the final stage barrier of the round, which every rank
//!   passes only after it finished all its reads and writes, so every posted buffer outlives
//!   every access to it. A rank that gives up before the round runs withdraws its post first.
//! - All ranks agreed on the dtype, so every posted pointer points to values of the one type
//!   that dtype names (`crate::Element`'s invariant), and all lengths were
//!   checked locally (each rank's buffers against its own description) and across ranks (the
//!   descriptions against each other) before the round ran, so every range below is in bounds.
//! - Within one stage no two ranks write the same element, and no rank reads an element another
//!   rank writes in that stage; stage barriers order the stages (release/acquire via the mutex).
//!   Per collective: all_reduce stage 1 writes chunk r of rank r's recv and reads chunk r of every
//!   send; stage 2 writes the other chunks of rank r's recv and reads chunk j of rank j's recv
//!   (final since stage 1). Every other collective has one stage in which rank r writes only its
//!   own recv and reads only sends (for broadcast: the root's buffer, which nobody writes).
//!   In-place all_reduce posts one buffer as both send and recv; the same ranges hold.

use std::ops::Range;

use half::bf16;

use super::super::types::{Reduce, ReduceOp};
use super::bufs::RawBufs;
use super::desc::OpKind;
use super::group::{Group, Round};
use crate::dtype::{DType, Element};

// SAFETY: the pointers are only dereferenced under the round protocol of this module's doc,
// which guarantees that the pointee is alive and that the accesses do not race.
unsafe impl Send for RawBufs {}
// SAFETY: as above; sharing the address itself is harmless.
unsafe impl Sync for RawBufs {}

/// Elements per reduction block: the accumulator lives on the stack (8 KiB for f64).
const BLOCK: usize = 1024;

/// Exclusive prefix sums: the offset of each rank's part in a packed buffer.
pub(super) fn offsets(counts: &[usize]) -> Vec<usize> {
    let mut acc = 0;
    counts
        .iter()
        .map(|&c| {
            let o = acc;
            acc += c;
            o
        })
        .collect()
}

/// The near-equal split of `n` elements over `parts` (the first `n % parts` get one more).
pub fn even_counts(n: usize, parts: usize) -> Vec<usize> {
    if parts == 0 {
        return Vec::new();
    }
    (0..parts)
        .map(|i| n / parts + usize::from(i < n % parts))
        .collect()
}

/// Runs this rank's part of a data-moving round and the round's stage barriers.
pub(super) fn execute<T: Element>(group: &Group, round: &Round, me: usize) {
    let posts = &round.posts;
    let desc = &posts[me].desc;
    let world = posts.len();
    match desc.kind {
        OpKind::AllReduce => {
            let op = desc.reduce.unwrap_or(ReduceOp::Sum);
            let counts = even_counts(desc.count, world);
            let offs = offsets(&counts);
            let mine = offs[me]..offs[me] + counts[me];
            reduce_into::<T>(round, me, op, mine.clone(), mine.start);
            group.stage(false);
            for j in (0..world).filter(|&j| j != me) {
                // SAFETY: see the module doc (all_reduce stage 2).
                unsafe {
                    copy::<T>(
                        posts[j].bufs.recv::<T>(),
                        posts[me].bufs.recv(),
                        offs[j],
                        offs[j],
                        counts[j],
                    )
                };
            }
        }
        OpKind::ReduceScatter | OpKind::ReduceScatterV => {
            let op = desc.reduce.unwrap_or(ReduceOp::Sum);
            let counts = rank_counts(desc.kind, desc.count, &desc.counts, world);
            let offs = offsets(&counts);
            reduce_into::<T>(round, me, op, offs[me]..offs[me] + counts[me], 0);
        }
        OpKind::AllGather | OpKind::AllGatherV => {
            let counts = rank_counts(desc.kind, desc.count, &desc.counts, world);
            let offs = offsets(&counts);
            for j in 0..world {
                // SAFETY: see the module doc (one stage, reads of sends).
                unsafe {
                    copy::<T>(
                        posts[j].bufs.send(),
                        posts[me].bufs.recv(),
                        0,
                        offs[j],
                        counts[j],
                    )
                };
            }
        }
        OpKind::Broadcast => {
            if let Some(root) = desc.root.filter(|&r| r != me) {
                // SAFETY: see the module doc (the root's buffer is only read).
                unsafe {
                    copy::<T>(
                        posts[root].bufs.send(),
                        posts[me].bufs.recv(),
                        0,
                        0,
                        desc.count,
                    )
                };
            }
        }
        OpKind::AllToAll | OpKind::AllToAllV => {
            for j in 0..world {
                let (src_off, dst_off, n) = if desc.kind == OpKind::AllToAll {
                    (me * desc.count, j * desc.count, desc.count)
                } else {
                    let theirs = &posts[j].desc.counts;
                    let src_off: usize = theirs[..me].iter().sum();
                    let dst_off: usize = desc.recv_counts[..j].iter().sum();
                    (src_off, dst_off, theirs[me])
                };
                // SAFETY: see the module doc (one stage, reads of sends).
                unsafe {
                    copy::<T>(
                        posts[j].bufs.send(),
                        posts[me].bufs.recv(),
                        src_off,
                        dst_off,
                        n,
                    )
                };
            }
        }
        OpKind::Barrier | OpKind::Split => {}
    }
    group.stage(true);
}

/// Per-rank counts of a (possibly uneven) gather/scatter: equal `count` or the explicit list.
fn rank_counts(kind: OpKind, count: usize, counts: &[usize], world: usize) -> Vec<usize> {
    match kind {
        OpKind::AllGatherV | OpKind::ReduceScatterV => counts.to_vec(),
        _ => vec![count; world],
    }
}

/// Reduces `range` of every rank's send buffer (in rank order) into this rank's recv buffer
/// starting at `dst_off`, with the reduction of the Rust type `T::DTYPE` names. That type is
/// `T` itself (`Element` gives each `DType` to exactly one type, of that representation); the
/// match only recovers the crate-private `Reduce` impl, which a public `T: Element` bound
/// cannot name.
fn reduce_into<T: Element>(
    round: &Round,
    me: usize,
    op: ReduceOp,
    range: Range<usize>,
    dst_off: usize,
) {
    match T::DTYPE {
        DType::F32 => reduce_typed::<f32>(round, me, op, range, dst_off),
        DType::BF16 => reduce_typed::<bf16>(round, me, op, range, dst_off),
        DType::F64 => reduce_typed::<f64>(round, me, op, range, dst_off),
        DType::I32 => reduce_typed::<i32>(round, me, op, range, dst_off),
        DType::I64 => reduce_typed::<i64>(round, me, op, range, dst_off),
        DType::U32 => reduce_typed::<u32>(round, me, op, range, dst_off),
        DType::U8 => reduce_typed::<u8>(round, me, op, range, dst_off),
    }
}

fn reduce_typed<T: Reduce>(
    round: &Round,
    me: usize,
    op: ReduceOp,
    range: Range<usize>,
    dst_off: usize,
) {
    let posts = &round.posts;
    // Every rank posted buffers of the agreed dtype, which is T's (see `reduce_into`).
    debug_assert!(posts.iter().all(|p| p.desc.dtype == Some(T::DTYPE)));
    let avg_over = (op == ReduceOp::Avg).then_some(posts.len());
    let out = posts[me].bufs.recv::<T>();
    let mut acc = [T::Acc::default(); BLOCK];
    let mut off = 0;
    let len = range.len();
    while off < len {
        let b = BLOCK.min(len - off);
        let acc = &mut acc[..b];
        for (k, p) in posts.iter().enumerate() {
            // SAFETY: see the module doc; the slice lives only for this block's read, which ends
            // before the write below, so an in-place buffer is never borrowed twice.
            let src =
                unsafe { std::slice::from_raw_parts(p.bufs.send::<T>().add(range.start + off), b) };
            if k == 0 {
                T::load(acc, src);
            } else {
                T::combine(op, acc, src);
            }
        }
        // SAFETY: see the module doc; only this rank writes this range of its recv buffer.
        let dst = unsafe { std::slice::from_raw_parts_mut(out.add(dst_off + off), b) };
        T::store(acc, dst, avg_over);
        off += b;
    }
}

/// Copies `n` elements from `src + src_off` to `dst + dst_off`.
///
/// # Safety
/// Both ranges are in bounds of live buffers and do not overlap, as the module doc lays out.
unsafe fn copy<T>(src: *const T, dst: *mut T, src_off: usize, dst_off: usize, n: usize) {
    if n == 0 || std::ptr::eq(src.wrapping_add(src_off), dst.wrapping_add(dst_off)) {
        return;
    }
    // SAFETY: guaranteed by the caller.
    unsafe { std::ptr::copy_nonoverlapping(src.add(src_off), dst.add(dst_off), n) };
}
