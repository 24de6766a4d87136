//! Stream-safe reuse in the caching allocator, run against the CANN emulator, whose streams
//! run queued work on worker threads: a block handed to a second stream while the first
//! stream's queued work still reads it shows up as wrong bytes, not as silence.
//!
//! Each test holds a stream's worker (the emulator's test hook) so that work queued on it
//! has provably not run when the block is freed and requested again, then checks both where
//! the allocator put the new buffer and what the held work finally read. The controls show
//! the hazard itself: with no stream named (`alloc_in`), or with a use on another stream not
//! recorded, the block is handed on at once and the held copy reads the new owner's bytes.
//!
//! Tests run in parallel threads of this process; each uses its own device ordinal, so the
//! process-wide allocator of one test is not touched by another.

#![cfg(feature = "npu")]

use cannon_runtime::{CachingAllocator, Device, DeviceBuffer, Stream};
use cannon_sys::acl;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Values per buffer: 16 KiB of f32, one 16384-byte block.
const N: usize = 4096;

/// True when the CANN in use is the emulator (the hold hook exists only there); on an
/// installed CANN these tests say they skip.
fn emulator(what: &str) -> bool {
    let emu = match cannon_sys::emulator::select_for_tests() {
        Ok(c) => c.is_emulator(),
        Err(e) => panic!("{e}"),
    };
    if !emu {
        eprintln!("skipped on the installed CANN (needs the emulator's stream hold): {what}");
    }
    emu
}

/// The emulator's test hook (not a CANN function): holds a stream's worker before its next
/// task, so work queued on it has not run until the hold is lifted. Returns its status.
fn hold(stream: &Stream, on: bool) -> acl::aclError {
    type Hold = unsafe extern "C" fn(acl::aclrtStream, i32) -> acl::aclError;
    let lib = cannon_sys::loader::library(cannon_sys::Lib::AscendCl).unwrap();
    let f = lib.symbol(c"cannon_emu_stream_hold").unwrap();
    // SAFETY: the emulator exports the hook with this signature.
    let f: Hold = unsafe { std::mem::transmute::<*mut c_void, Hold>(f.as_ptr()) };
    let raw = stream.acl_stream().unwrap().raw();
    // SAFETY: a live stream handle.
    unsafe { f(raw, on as i32) }
}

/// A hold lifted on drop, so a failing assertion unwinds instead of hanging in the
/// stream's drop (which drains the held queue).
struct Restored<'a>(&'a Stream);

impl<'a> Restored<'a> {
    fn new(stream: &'a Stream) -> Self {
        assert_eq!(hold(stream, true), 0);
        Restored(stream)
    }
}

impl Drop for Restored<'_> {
    fn drop(&mut self) {
        // No assertion here: this may run while a failed assertion unwinds.
        let _ = hold(self.0, false);
    }
}

fn pattern() -> Vec<f32> {
    (0..N).map(|i| i as f32 * 0.25 + 1.0).collect()
}

/// Device `ordinal`'s allocator, two streams on it, and the pattern uploaded into a buffer
/// allocated for stream `a`.
fn setup(ordinal: u32) -> (Arc<CachingAllocator>, Stream, Stream, Vec<f32>) {
    let d = Device::Npu(ordinal);
    let (a, b) = (Stream::new(d).unwrap(), Stream::new(d).unwrap());
    (d.allocator().unwrap(), a, b, pattern())
}

#[test]
fn a_block_freed_on_one_stream_serves_another_only_after_that_streams_work() {
    if !emulator("a_block_freed_on_one_stream_serves_another_only_after_that_streams_work") {
        return;
    }
    let (alloc, a, b, host) = setup(0);
    let src = DeviceBuffer::clone_htod(&a, &host).unwrap();
    let mut dst = DeviceBuffer::<f32>::alloc_zeros(&a, N).unwrap();
    a.synchronize().unwrap();
    let addr = src.as_raw_ptr() as usize;

    let held = Restored::new(&a);
    dst.memcpy_dtod(&a, &src.view()).unwrap(); // queued on a; reads src when a runs
    drop(src); // freed while a's copy of it is still queued
    let before = alloc.stats();
    let mut on_b = DeviceBuffer::<f32>::alloc(&b, N).unwrap();
    assert_ne!(
        on_b.as_raw_ptr() as usize,
        addr,
        "the block went to stream b while a's queued copy still reads it"
    );
    assert_eq!(
        alloc.stats().num_device_allocs,
        before.num_device_allocs + 1
    );
    on_b.memcpy_htod(&b, &vec![-1.0; N]).unwrap(); // b's owner writes its block at once
    drop(held);
    assert_eq!(
        dst.clone_dtoh(&a).unwrap(),
        host,
        "a's copy read its source"
    );

    // a's work is done (clone_dtoh drained it): the block now serves b without a new
    // device allocation.
    let before = alloc.stats();
    let again = DeviceBuffer::<f32>::alloc(&b, N).unwrap();
    assert_eq!(again.as_raw_ptr() as usize, addr);
    assert_eq!(alloc.stats().num_device_allocs, before.num_device_allocs);
}

#[test]
fn control_without_a_stream_the_block_is_handed_on_at_once_and_the_held_copy_reads_it() {
    if !emulator("control_without_a_stream_the_block_is_handed_on_at_once") {
        return;
    }
    let (alloc, a, b, host) = setup(1);
    let mut src = DeviceBuffer::<f32>::alloc_in(&alloc, N).unwrap();
    src.memcpy_htod(&a, &host).unwrap();
    let mut dst = DeviceBuffer::<f32>::alloc_zeros(&a, N).unwrap();
    a.synchronize().unwrap();
    let addr = src.as_raw_ptr() as usize;

    let held = Restored::new(&a);
    dst.memcpy_dtod(&a, &src.view()).unwrap();
    drop(src);
    // No stream named on either side: the allocator cannot know about a's queued copy.
    let mut next = DeviceBuffer::<f32>::alloc_in(&alloc, N).unwrap();
    assert_eq!(
        next.as_raw_ptr() as usize,
        addr,
        "cache hit on the same block"
    );
    next.memcpy_htod(&b, &vec![-1.0; N]).unwrap();
    drop(held);
    // The race the stream-tagged allocation above prevents: a's copy read b's bytes.
    assert_eq!(dst.clone_dtoh(&a).unwrap(), vec![-1.0; N]);
}

#[test]
fn a_block_is_reused_on_its_own_stream_at_once_and_stream_order_keeps_it_correct() {
    if !emulator("a_block_is_reused_on_its_own_stream_at_once") {
        return;
    }
    let (alloc, a, _b, host) = setup(2);
    let src = DeviceBuffer::clone_htod(&a, &host).unwrap();
    let mut dst = DeviceBuffer::<f32>::alloc_zeros(&a, N).unwrap();
    a.synchronize().unwrap();
    let addr = src.as_raw_ptr() as usize;

    let held = Restored::new(&a);
    dst.memcpy_dtod(&a, &src.view()).unwrap();
    drop(src);
    let before = alloc.stats();
    let mut reused = DeviceBuffer::<f32>::alloc(&a, N).unwrap();
    assert_eq!(
        reused.as_raw_ptr() as usize,
        addr,
        "same-stream reuse waits for nothing"
    );
    assert_eq!(alloc.stats().num_device_allocs, before.num_device_allocs);
    reused.memset_zeros(&a).unwrap(); // queued behind the copy on a
    drop(held);
    assert_eq!(dst.clone_dtoh(&a).unwrap(), host);
    assert_eq!(reused.clone_dtoh(&a).unwrap(), vec![0.0; N]);
}

#[test]
fn record_stream_keeps_a_block_from_its_own_stream_until_the_other_streams_work_is_done() {
    if !emulator("record_stream_keeps_a_block_from_its_own_stream") {
        return;
    }
    let (alloc, a, b, host) = setup(3);
    for record in [true, false] {
        let src = DeviceBuffer::clone_htod(&a, &host).unwrap();
        let mut dst = DeviceBuffer::<f32>::alloc_zeros(&b, N).unwrap();
        a.synchronize().unwrap();
        b.synchronize().unwrap();
        let addr = src.as_raw_ptr() as usize;

        let held = Restored::new(&b);
        dst.memcpy_dtod(&b, &src.view()).unwrap(); // src, owned by a, read on b
        if record {
            src.record_stream(&b).unwrap();
        }
        drop(src);
        let mut next = DeviceBuffer::<f32>::alloc(&a, N).unwrap();
        next.memset_zeros(&a).unwrap(); // a is not held: runs at once
        a.synchronize().unwrap();
        drop(held);
        let read = dst.clone_dtoh(&b).unwrap();
        if record {
            assert_ne!(next.as_raw_ptr() as usize, addr, "b's queued read ignored");
            assert_eq!(read, host, "b's copy read its source");
            // b has drained (clone_dtoh): the block serves its own stream again.
            let again = DeviceBuffer::<f32>::alloc(&a, N).unwrap();
            assert_eq!(again.as_raw_ptr() as usize, addr);
        } else {
            // Control: unrecorded, the block is a's at once and b's held copy reads zeros.
            assert_eq!(next.as_raw_ptr() as usize, addr);
            assert_eq!(read, vec![0.0; N]);
        }
        assert!(alloc.take_drop_errors().is_empty());
    }
}

#[test]
fn empty_cache_waits_for_queued_work_before_returning_memory_to_the_device() {
    if !emulator("empty_cache_waits_for_queued_work") {
        return;
    }
    let (alloc, a, _b, host) = setup(4);
    let src = DeviceBuffer::clone_htod(&a, &host).unwrap();
    let mut dst = DeviceBuffer::<f32>::alloc_zeros(&a, N).unwrap();
    a.synchronize().unwrap();
    let held = Restored::new(&a);
    dst.memcpy_dtod(&a, &src.view()).unwrap();
    drop(src);
    let reserved = alloc.stats().reserved;
    let t0 = Instant::now();
    std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(held);
        });
        alloc.empty_cache(); // must not free src's block under the held copy
    });
    assert!(
        t0.elapsed() >= Duration::from_millis(80),
        "empty_cache returned before the queued copy ran: {:?}",
        t0.elapsed()
    );
    assert!(alloc.stats().reserved < reserved, "the block was released");
    assert_eq!(dst.clone_dtoh(&a).unwrap(), host);
    assert!(alloc.take_drop_errors().is_empty());
}
