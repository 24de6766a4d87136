//! N in-process CPU ranks: one thread each, one communicator each (`CpuWorld`), each with its
//! own caching allocator, so every rank's memory figures are its own, and its own thread pool
//! of the global pool's threads / N for its kernels. Meta ranks ([`run_meta_ranks`]) are the
//! same threads on the meta device: their rounds check every call and move nothing, their
//! allocators count what the layout would hold.

use super::FsdpError;
use crate::model::DeviceCtx;
use cannon_runtime::comm::{Communicator, CpuWorld};
use cannon_runtime::{CachingAllocator, Device, Stream};
use std::sync::Arc;
use std::time::Duration;

/// A stream and a private allocator on the host: one CPU rank's device. Its cache is
/// bounded (`CachingAllocator::bound_cache`): the ranks of a process share its memory,
/// and each rank's cache of every shape its steps freed would add up over the ranks.
pub fn cpu_rank_exec() -> Result<DeviceCtx, FsdpError> {
    let alloc = CachingAllocator::new_cpu();
    alloc.bound_cache(cannon_runtime::alloc::HOST_RESERVE_SLACK);
    let exec = DeviceCtx::with_allocator(Arc::new(Stream::cpu()), alloc)?;
    Ok(exec)
}

/// A rank's own thread pool of `threads` (its share of the caller's pool, at least one).
/// Ranks that queue their parallel kernels on one shared pool interleave each
/// other's tasks, so a GEMM's workers wait on the other rank's tasks between theirs.
fn rank_pool(threads: usize) -> Result<rayon::ThreadPool, FsdpError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("cannon-rank-worker-{i}"))
        .build()
        .map_err(|e| FsdpError::Invalid(format!("a rank's thread pool of {threads}: {e}")))
}

/// Runs `f(communicator, exec)` on `world` CPU ranks, each in its own thread, and returns
/// their results in rank order. `timeout` bounds every wait of a rank for its peers. A rank
/// that fails drops its communicator, which fails its peers' pending collectives at once; the
/// error returned is the failing rank's own (not its peers' "a peer is gone").
pub fn run_cpu_ranks<R, F>(world: usize, timeout: Duration, f: F) -> Result<Vec<R>, FsdpError>
where
    R: Send,
    F: Fn(Communicator, DeviceCtx) -> Result<R, FsdpError> + Sync,
{
    run_ranks(Device::Cpu, world, timeout, f)
}

/// A stream and a private allocator on the meta device: one meta rank's device.
pub fn meta_rank_exec() -> Result<DeviceCtx, FsdpError> {
    let stream = Stream::new(Device::Meta)?;
    Ok(DeviceCtx::with_allocator(
        Arc::new(stream),
        CachingAllocator::new_meta(),
    )?)
}

/// [`run_cpu_ranks`] on `world` meta ranks (see the module docs).
pub fn run_meta_ranks<R, F>(world: usize, timeout: Duration, f: F) -> Result<Vec<R>, FsdpError>
where
    R: Send,
    F: Fn(Communicator, DeviceCtx) -> Result<R, FsdpError> + Sync,
{
    run_ranks(Device::Meta, world, timeout, f)
}

fn run_ranks<R, F>(
    device: Device,
    world: usize,
    timeout: Duration,
    f: F,
) -> Result<Vec<R>, FsdpError>
where
    R: Send,
    F: Fn(Communicator, DeviceCtx) -> Result<R, FsdpError> + Sync,
{
    let (comms, exec): (_, fn() -> Result<DeviceCtx, FsdpError>) = match device {
        Device::Meta => (CpuWorld::meta(world, timeout)?, meta_rank_exec),
        _ => (CpuWorld::new(world, timeout)?, cpu_rank_exec),
    };
    // The caller's pool (the global one from a plain thread), shared out over the ranks.
    let threads = (rayon::current_num_threads() / world.max(1)).max(1);
    let results: Vec<Result<R, FsdpError>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let f = &f;
                let h = std::thread::Builder::new()
                    .name(format!("cannon-rank-{rank}"))
                    .spawn_scoped(s, move || rank_pool(threads)?.install(|| f(comm, exec()?)));
                (rank, h)
            })
            .collect();
        handles
            .into_iter()
            .map(|(rank, h)| match h {
                Err(e) => Err(FsdpError::Invalid(format!(
                    "rank {rank}: thread not started: {e}"
                ))),
                Ok(h) => h.join().unwrap_or_else(|p| {
                    let message = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "panicked".into());
                    Err(FsdpError::RankPanicked { rank, message })
                }),
            })
            .collect()
    });
    let mut out = Vec::with_capacity(world);
    let mut first_err: Option<FsdpError> = None;
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Ok(x) => out.push(x),
            Err(e) => {
                let e = e.on_rank(rank);
                // The root cause wins over the peers' reports of it.
                let replace = match &first_err {
                    None => true,
                    Some(prev) => prev.is_peer_failure() && !e.is_peer_failure(),
                };
                if replace {
                    first_err = Some(e);
                }
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each rank's kernels run on its own pool of the global pool's threads / N (at least
    /// one), not on the global pool the ranks would share.
    #[test]
    fn every_rank_runs_on_its_share_of_the_threads() {
        let global = rayon::current_num_threads();
        for world in [1, 2, 3] {
            let seen = run_cpu_ranks(world, Duration::from_secs(20), |_, _| {
                Ok((rayon::current_num_threads(), rayon::current_thread_index()))
            })
            .unwrap();
            let want = (global / world).max(1);
            for (rank, (threads, index)) in seen.into_iter().enumerate() {
                assert_eq!(threads, want, "world {world}, rank {rank}");
                assert!(index.is_some(), "rank {rank} is not on a pool thread");
            }
        }
    }
}
