//! A caching allocator per device with torch-like statistics.
//!
//! Like torch's CUDA caching allocator, freed blocks are kept in a cache and handed out again
//! to requests of the same rounded size, so a training loop that allocates the same shapes
//! every step stops calling the device allocator after step one. The statistics follow torch:
//!
//! - `allocated`: bytes the live blocks were asked for (each rounded up to [`BLOCK_ROUND`]
//!   bytes; a block reused for a smaller request holds up to 1/8 more, counted in `reserved`
//!   only, so the figure is what the requests need and a memory plan can state it exactly);
//! - `reserved`: bytes obtained from the device/host and not yet returned (live + cached);
//! - `peak_allocated` / `peak_reserved`: maxima since creation or [`CachingAllocator::reset_peak`].
//!
//! Cache policy, chosen to be predictable: a request is served by a cached block of exactly
//! its rounded size, else by the smallest cached block at most [`REUSE_SLACK`] larger
//! (blocks are never split); otherwise a new block is obtained. If that fails, the whole
//! cache is released and the request retried once (torch does the same before reporting
//! OOM). The slack is for batches whose shapes move from step to step (images of several
//! sizes, padded lengths): with exact sizes only, the built-in default's steps obtained 46-99
//! of their 121 blocks anew, 11 with the slack; a run of one shape takes exact blocks from
//! its second step on, as before.
//!
//! Training ranks bound their caches ([`CachingAllocator::bound_cache`]): before a new block,
//! cached blocks are released (largest first) so that what is reserved stays within 1/8 (CPU
//! ranks, [`HOST_RESERVE_SLACK`]) or 1/16 (NPU ranks, [`DEVICE_RESERVE_SLACK`]) of the most
//! ever allocated, which keeps a rank's memory at what its plan says, at the cost of a few
//! blocks a step obtained anew.
//!
//! Streams (NPU): a block remembers the stream it was allocated for
//! ([`crate::DeviceBuffer::alloc`]) and the other streams it was used on
//! ([`crate::DeviceBuffer::record_stream`]). When it is freed, an event is recorded on each
//! of those streams that is still alive; the block is then reused at once on its own
//! stream, and on another stream only once those events have completed (the rule is in
//! `cache`). Memory goes back to the device only after its events have completed. On the
//! CPU work is finished when a call returns, so streams are ignored there and the figures are
//! exactly those of a single-stream cache. Blocks allocated without a stream
//! ([`crate::DeviceBuffer::alloc_in`]) have no known owner and are reused only by requests
//! without a stream, on the caller's ordering, as before.
//!
//! Cost on the NPU: one `aclrtRecordEvent` per stream per freed block (events are pooled,
//! so no event is created in a steady state) and an `aclrtQueryEventStatus` per candidate
//! block of another stream.

mod cache;
mod host;
pub(crate) mod raw;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream::{Event, Stream, StreamRef};
use cache::{Cached, Fence};
use host::HostMemory;
pub use host::HUGE_BLOCK;
use parking_lot::Mutex;
pub(crate) use raw::RawMemory;
pub use raw::BLOCK_ALIGN;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Events kept for reuse by one allocator (enough for the frees of one training step
/// between two reuses; more are destroyed).
const EVENT_POOL: usize = 256;

/// Every block is a multiple of this many bytes (torch's `kMinBlockSize`).
pub const BLOCK_ROUND: usize = 512;
/// A cached block serves a smaller request when it is at most `size / REUSE_SLACK` bytes
/// larger than the request's rounded size (12.5 %).
pub const REUSE_SLACK: usize = 8;
/// The bound of the CPU ranks' caches ([`CachingAllocator::bound_cache`]): what is reserved
/// with a new block stays within `1 + 1/HOST_RESERVE_SLACK` times the most ever allocated.
pub const HOST_RESERVE_SLACK: usize = 8;
/// The bound of the NPU ranks' caches ([`CachingAllocator::bound_cache`]), tighter than the
/// host's: a step's transient blocks on an NPU are few and large (gathered groups, their
/// gradients), so the few freed and obtained anew cost little next to the step, while the
/// blocks cannot be split (a 1/8 slack let a 0.86 B model's rank reserve 10 % above its
/// allocation peak and its plan).
pub const DEVICE_RESERVE_SLACK: usize = 16;
/// Memory figures of one allocator, in bytes (counts where named).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub allocated: usize,
    pub reserved: usize,
    pub peak_allocated: usize,
    pub peak_reserved: usize,
    /// Allocation requests served (including cache hits).
    pub num_allocs: u64,
    /// Requests that had to go to the device/host allocator.
    pub num_device_allocs: u64,
    /// Blocks returned to the device/host (cache releases).
    pub num_device_frees: u64,
}

/// Rounds a byte count up to the block granularity.
pub fn round_size(bytes: usize) -> usize {
    // Saturates instead of wrapping: a request near usize::MAX then fails as too large for
    // the device or host, not as a tiny block.
    bytes.div_ceil(BLOCK_ROUND).saturating_mul(BLOCK_ROUND)
}

/// One block handed out by the allocator. Owned by exactly one buffer.
pub(crate) struct Block {
    pub(crate) ptr: *mut u8,
    /// Bytes of the block (its key in the cache).
    pub(crate) size: usize,
    /// Bytes counted in `allocated`: the request's rounded size (<= `size`).
    counted: usize,
    /// The stream the block was allocated for (`None`: none named, or the host).
    owner: Option<StreamRef>,
    /// Other streams the block was used on (`record_stream`), each once; behind a lock so
    /// a buffer borrowed shared (as an input) can still be recorded.
    uses: Mutex<Vec<StreamRef>>,
}

impl Block {
    /// A block that owns nothing (zero-length buffers, and a buffer's place after drop).
    pub(crate) fn empty() -> Self {
        Block {
            ptr: std::ptr::null_mut(),
            size: 0,
            counted: 0,
            owner: None,
            uses: Mutex::new(Vec::new()),
        }
    }

    /// Notes that queued work on `stream` uses the block, so a free must wait for it before
    /// the block serves another stream. Host blocks and empty blocks need nothing.
    pub(crate) fn record_stream(&self, device: Device, stream: &Stream) -> Result<()> {
        if stream.device() != device {
            return Err(Error::DeviceMismatch {
                what: "record_stream",
                expected: device,
                found: stream.device(),
            });
        }
        if device.runs_inline() || self.size == 0 {
            return Ok(());
        }
        let id = stream.id();
        let mut uses = self.uses.lock();
        let known =
            self.owner.as_ref().is_some_and(|o| o.id == id) || uses.iter().any(|u| u.id == id);
        if !known {
            uses.push(stream.weak());
        }
        Ok(())
    }
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("ptr", &self.ptr)
            .field("size", &self.size)
            .field("owner", &self.owner.as_ref().map(|o| o.id))
            .field(
                "uses",
                &self.uses.lock().iter().map(|u| u.id).collect::<Vec<_>>(),
            )
            .finish()
    }
}

// SAFETY: a Block is a unique handle to its memory (the allocator hands each block to one
// owner at a time), so moving it between threads is as safe as moving a Box<[u8]>.
unsafe impl Send for Block {}
// SAFETY: shared references to a Block read its address, size and owner, and change only
// `uses`, which is behind a lock.
unsafe impl Sync for Block {}

#[derive(Default)]
struct State {
    /// Cached free blocks by size, oldest first.
    free: BTreeMap<usize, Vec<Cached>>,
    /// Events of completed fences, recorded again by later frees.
    events: Vec<Event>,
    stats: MemoryStats,
    /// The largest `allocated` since creation or the last [`CachingAllocator::empty_cache`]
    /// (`reset_peak` leaves it): a bounded cache is trimmed against it
    /// ([`CachingAllocator::bound_cache`]).
    high_water: usize,
    /// The bound's slack divisor, when the cache is bounded ([`CachingAllocator::bound_cache`]).
    bound: Option<usize>,
    /// Errors met while freeing from `Drop`, which cannot return them (cudarc's pattern).
    drop_errors: Vec<String>,
}

/// The caching allocator of one device.
pub struct CachingAllocator {
    device: Device,
    raw: Box<dyn RawMemory>,
    state: Mutex<State>,
}

impl std::fmt::Debug for CachingAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("device", &self.device)
            .field("stats", &self.stats())
            .finish()
    }
}

impl CachingAllocator {
    /// A private host allocator (tests, or a trainer that wants its own figures). The
    /// process-wide one of each device is [`Device::allocator`].
    pub fn new_cpu() -> Arc<Self> {
        Self::new_cpu_with_limit(None)
    }

    /// A host allocator that refuses to reserve more than `limit` bytes.
    pub fn new_cpu_with_limit(limit: Option<usize>) -> Arc<Self> {
        let raw = HostMemory {
            limit,
            in_use: Mutex::new(0),
        };
        Self::with_raw(Device::Cpu, Box::new(raw))
    }

    /// A private allocator of the meta device: blocks with addresses and no storage,
    /// counted, cached and reused exactly as a real device's ([`crate::meta`]).
    pub fn new_meta() -> Arc<Self> {
        Self::with_raw(Device::Meta, Box::new(crate::meta::MetaMemory::default()))
    }

    /// An allocator of `device` over the raw memory `raw` (the device module wires each
    /// backend's memory in; this module knows none of them but the host's).
    pub(crate) fn with_raw(device: Device, raw: Box<dyn RawMemory>) -> Arc<Self> {
        Arc::new(CachingAllocator {
            device,
            raw,
            state: Mutex::new(State::default()),
        })
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// A block of at least `bytes` (rounded up to BLOCK_ROUND) for work on `stream` (`None`:
    /// the caller orders its uses itself), and whether it was obtained anew from the device
    /// or the host rather than from the cache (memory that [`Self::prefault_zeroed`] may
    /// then make resident as zeros). Zero bytes gives an empty block that owns nothing and
    /// is not counted.
    pub(crate) fn allocate(&self, bytes: usize, stream: Option<&Stream>) -> Result<(Block, bool)> {
        if let Some(s) = stream {
            if s.device() != self.device {
                return Err(Error::DeviceMismatch {
                    what: "allocate",
                    expected: self.device,
                    found: s.device(),
                });
            }
        }
        if bytes == 0 {
            return Ok((Block::empty(), false));
        }
        // Host (and meta) work is complete when issued: no stream needs tracking there.
        let owner = stream
            .filter(|_| !self.device.runs_inline())
            .map(Stream::weak);
        let req = owner.as_ref().map(|o| o.id);
        let size = round_size(bytes);
        let mut st = self.state.lock();
        st.stats.num_allocs += 1;
        // The exact size first, then the next larger sizes within the slack.
        let cached = st
            .free
            .range_mut(size..=size.saturating_add(size / REUSE_SLACK))
            .find_map(|(&block, list)| cache::take(list, req).map(|c| (block, c)));
        if let Some((block, _)) = cached {
            if st.free.get(&block).is_some_and(|v| v.is_empty()) {
                st.free.remove(&block);
            }
        }
        let (ptr, block, fresh) = match cached {
            Some((block, c)) => {
                // The fences are over (or on the requesting stream itself): their events
                // serve later frees.
                let State { events, .. } = &mut *st;
                for f in c.fences {
                    if events.len() < EVENT_POOL {
                        events.push(f.event);
                    }
                }
                (c.addr as *mut u8, block, false)
            }
            None => {
                if let Some(slack) = st.bound {
                    self.trim_cache(&mut st, size, slack);
                }
                let ptr = match self.raw.raw_alloc(size)? {
                    Some(p) => p,
                    None => {
                        // Give the whole cache back and retry once before calling it OOM.
                        self.release_cache(&mut st);
                        match self.raw.raw_alloc(size)? {
                            Some(p) => p,
                            None => {
                                return Err(Error::OutOfMemory {
                                    device: self.device,
                                    requested: size,
                                    allocated: st.stats.allocated,
                                    reserved: st.stats.reserved,
                                })
                            }
                        }
                    }
                };
                st.stats.num_device_allocs += 1;
                st.stats.reserved += size;
                st.stats.peak_reserved = st.stats.peak_reserved.max(st.stats.reserved);
                (ptr, size, true)
            }
        };
        st.stats.allocated += size;
        st.stats.peak_allocated = st.stats.peak_allocated.max(st.stats.allocated);
        st.high_water = st.high_water.max(st.stats.allocated);
        let block = Block {
            ptr,
            size: block,
            counted: size,
            owner,
            uses: Mutex::new(Vec::new()),
        };
        Ok((block, fresh))
    }

    /// Makes a block that [`Self::allocate`] obtained anew, and that nothing has
    /// written since, resident and holding zeros; false when its memory cannot (then it is
    /// as it was). Not under the allocator's lock: the kernel takes a while over a large
    /// block (it zeroes every page), and other threads' requests need not wait for it.
    pub(crate) fn prefault_zeroed(&self, block: &Block) -> bool {
        block.size > 0 && self.raw.prefault_zeroed(block.ptr, block.size)
    }

    /// Returns a block to the cache (it stays reserved), fenced on every stream that used it.
    pub(crate) fn free(&self, block: Block) {
        if block.size == 0 {
            return;
        }
        let mut st = self.state.lock();
        st.stats.allocated -= block.counted;
        let Block {
            ptr,
            size,
            owner,
            uses,
            ..
        } = block;
        let mut entry = Cached::plain(ptr as usize);
        entry.owner = owner.as_ref().map(|o| o.id);
        entry.covered = owner.is_some();
        for s in owner.iter().chain(uses.into_inner().iter()) {
            match self.fence(&mut st, s) {
                Ok(Some(f)) => entry.fences.push(f),
                Ok(None) => {}
                Err(e) => {
                    // Neither an event nor a synchronise: the block's last use on `s` is
                    // unknown, so it is never handed out again (a leak, counted as reserved,
                    // rather than a use after free).
                    st.drop_errors
                        .push(format!("fencing a freed block of {size} bytes: {e}"));
                    return;
                }
            }
        }
        st.free.entry(size).or_default().push(entry);
    }

    /// An event recorded now on `s` (`None` when `s` is gone: its drop drained it). When the
    /// event cannot be made or recorded, the stream is synchronised instead, after which
    /// no fence is needed.
    fn fence(&self, st: &mut State, s: &StreamRef) -> Result<Option<Fence>> {
        let recorded = match st.events.pop().map_or_else(|| Event::new(self.device), Ok) {
            Ok(mut e) => match s.record(&mut e) {
                Ok(true) => Ok(Some(e)),
                Ok(false) => {
                    st.events.push(e);
                    Ok(None)
                }
                Err(err) => Err(err),
            },
            Err(err) => Err(err),
        };
        match recorded {
            Ok(Some(e)) => Ok(Some(Fence::new(s.id, e))),
            Ok(None) => Ok(None),
            Err(e) => {
                st.drop_errors
                    .push(format!("recording a free on stream {}: {e}", s.id));
                s.synchronize().map(|()| None)
            }
        }
    }

    /// From now on, before memory is obtained for a request the cache cannot serve, releases
    /// cached blocks, the largest first, until what is reserved with the request stays within
    /// `1 + 1/slack` of the most ever allocated (or of what is allocated with the request,
    /// when that is more). Without it a rank's cache kept every shape a step ever freed:
    /// 4.6-4.8 GiB reserved for 4.0 GiB allocated on each of four CPU ranks of a 0.86 B model,
    /// whose process then held 12 % more than its plan, and 4.70 GiB for 4.25 GiB on each of
    /// four NPU ranks of it. The price: a step whose sizes need more cached blocks than the
    /// bound allows obtains a few of them anew each time (page faults on the host; an
    /// `aclrtFree` after the block's last use and an `aclrtMalloc` on an NPU). Slacks:
    /// [`HOST_RESERVE_SLACK`], [`DEVICE_RESERVE_SLACK`]; 0 is taken as 1.
    pub fn bound_cache(&self, slack: usize) {
        self.state.lock().bound = Some(slack.max(1));
    }

    /// See [`Self::bound_cache`]: makes room for `size` more bytes. On a device only blocks
    /// whose fences cover every stream that used them are given back (after those fences):
    /// a block allocated without a stream may still be in use by work its caller queued, which
    /// only the caller orders, so it stays cached (as torch keeps such blocks).
    fn trim_cache(&self, st: &mut State, size: usize, slack: usize) {
        let base = st.high_water.max(st.stats.allocated + size);
        let limit = base.saturating_add(base / slack);
        let inline = self.device.runs_inline();
        // Ascending: the largest cached size is popped first.
        let mut sizes: Vec<usize> = st.free.keys().copied().collect();
        while st.stats.reserved + size > limit {
            let Some(block) = sizes.pop() else {
                return;
            };
            let Some(list) = st.free.get_mut(&block) else {
                continue;
            };
            let Some(at) = list.iter().rposition(|c| inline || c.covered) else {
                continue;
            };
            let c = list.remove(at);
            if list.is_empty() {
                st.free.remove(&block);
            } else {
                sizes.push(block); // more blocks of this size may go
            }
            // Queued work may still use the block (not on the host, whose work is complete
            // when issued): the device gets it back only after.
            if let Err(e) = c.wait() {
                st.drop_errors
                    .push(format!("waiting to release {block} bytes: {e}"));
                continue; // leaked (still counted as reserved), never freed in use
            }
            // SAFETY: cached blocks came from raw_alloc(block), are owned by no buffer, and
            // no queued work uses them: host work is complete when issued, and a device
            // block's fences cover every stream that used it (waited above).
            match unsafe { self.raw.raw_free(c.addr as *mut u8, block) } {
                Ok(()) => {
                    st.stats.reserved -= block;
                    st.stats.num_device_frees += 1;
                }
                Err(e) => st.drop_errors.push(format!("releasing {block} bytes: {e}")),
            }
        }
    }

    fn release_cache(&self, st: &mut State) {
        for (size, blocks) in std::mem::take(&mut st.free) {
            for c in blocks {
                // Queued work may still use the block: the device gets it back only after.
                if let Err(e) = c.wait() {
                    st.drop_errors
                        .push(format!("waiting to release {size} bytes: {e}"));
                    continue; // leaked (still counted as reserved), never freed in use
                }
                // SAFETY: cached blocks came from raw_alloc(size), have no owner, and no
                // queued work uses them (waited above).
                match unsafe { self.raw.raw_free(c.addr as *mut u8, size) } {
                    Ok(()) => {
                        st.stats.reserved -= size;
                        st.stats.num_device_frees += 1;
                    }
                    Err(e) => st.drop_errors.push(format!("releasing {size} bytes: {e}")),
                }
            }
        }
    }

    /// Releases every cached block to the device (torch's `empty_cache`). A bounded cache
    /// ([`Self::bound_cache`]) is bounded from here on against what is allocated now and
    /// what comes after, not against an earlier phase's high water: a run empties the cache
    /// between its step and its save or export, whose peaks are lower, so their caches are
    /// held to their own.
    pub fn empty_cache(&self) {
        let mut st = self.state.lock();
        self.release_cache(&mut st);
        st.high_water = st.stats.allocated;
    }

    pub fn stats(&self) -> MemoryStats {
        self.state.lock().stats
    }

    /// Sets the peaks to the current figures (torch's `reset_peak_memory_stats`).
    pub fn reset_peak(&self) {
        let mut st = self.state.lock();
        st.stats.peak_allocated = st.stats.allocated;
        st.stats.peak_reserved = st.stats.reserved;
    }

    /// Errors recorded while freeing in `Drop` since the last call.
    pub fn take_drop_errors(&self) -> Vec<String> {
        std::mem::take(&mut self.state.lock().drop_errors)
    }
}

impl Drop for CachingAllocator {
    fn drop(&mut self) {
        let st = self.state.get_mut();
        for (size, blocks) in std::mem::take(&mut st.free) {
            for c in blocks {
                if c.wait().is_err() {
                    continue; // leaked rather than freed while queued work may use it
                }
                // SAFETY: cached blocks came from raw_alloc(size) and have no owner; live
                // blocks keep the allocator alive through their buffer's Arc, so none remain;
                // no queued work uses the block (waited above).
                let _ = unsafe { self.raw.raw_free(c.addr as *mut u8, size) };
            }
        }
    }
}

#[cfg(test)]
mod tests;
