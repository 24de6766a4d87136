//! Allocator statistics: allocate/free sequences give exactly the expected figures.

use super::*;
use crate::buffer::DeviceBuffer;
use crate::stream::Stream;

const R: usize = BLOCK_ROUND;

#[test]
fn rounding_is_to_block_size() {
    assert_eq!(round_size(1), R);
    assert_eq!(round_size(R), R);
    assert_eq!(round_size(R + 1), 2 * R);
}

#[test]
fn allocate_free_sequence_gives_exact_figures() {
    let a = CachingAllocator::new_cpu();
    assert_eq!(a.stats(), MemoryStats::default());

    // 1000 f32 = 4000 bytes -> 4096 (8 blocks of 512).
    let x = DeviceBuffer::<f32>::alloc_in(&a, 1000).unwrap();
    let s = a.stats();
    assert_eq!((s.allocated, s.reserved), (4096, 4096));
    assert_eq!((s.peak_allocated, s.peak_reserved), (4096, 4096));

    // 10 bytes -> 512.
    let y = DeviceBuffer::<u8>::alloc_in(&a, 10).unwrap();
    assert_eq!((a.stats().allocated, a.stats().reserved), (4608, 4608));

    // Freeing keeps the block reserved (cached) and lowers `allocated` only.
    drop(x);
    let s = a.stats();
    assert_eq!(
        (s.allocated, s.reserved, s.peak_allocated, s.peak_reserved),
        (512, 4608, 4608, 4608)
    );

    // Same rounded size is served from the cache: no new device allocation.
    let before = a.stats().num_device_allocs;
    let z = DeviceBuffer::<f32>::alloc_in(&a, 1024).unwrap(); // 4096 bytes exactly
    let s = a.stats();
    assert_eq!(s.num_device_allocs, before);
    assert_eq!((s.allocated, s.reserved), (4608, 4608));

    // A different size is a new block.
    let w = DeviceBuffer::<f64>::alloc_in(&a, 100).unwrap(); // 800 -> 1024
    let s = a.stats();
    assert_eq!(
        (s.allocated, s.reserved, s.peak_allocated, s.peak_reserved),
        (5632, 5632, 5632, 5632)
    );

    drop((y, z, w));
    let s = a.stats();
    assert_eq!((s.allocated, s.reserved), (0, 5632));

    a.reset_peak();
    let s = a.stats();
    assert_eq!((s.peak_allocated, s.peak_reserved), (0, 5632));

    a.empty_cache();
    let s = a.stats();
    assert_eq!(
        (s.allocated, s.reserved, s.peak_allocated, s.peak_reserved),
        (0, 0, 0, 5632)
    );
    assert_eq!(s.num_device_allocs, s.num_device_frees);
    assert_eq!(s.num_allocs, 4);
}

/// A cached block serves a smaller request when it is at most 1/8 larger, the exact size
/// first and then the smallest such block; `allocated` counts the request, `reserved` the
/// block; a block more than 1/8 larger is left in the cache.
#[test]
fn a_slightly_larger_cached_block_serves_a_request() {
    let a = CachingAllocator::new_cpu();
    let addr = |b: &DeviceBuffer<u8>| b.as_raw_ptr() as usize;
    let (b16, b18, b24) = (
        DeviceBuffer::<u8>::alloc_in(&a, 16 * R).unwrap(),
        DeviceBuffer::<u8>::alloc_in(&a, 18 * R).unwrap(),
        DeviceBuffer::<u8>::alloc_in(&a, 24 * R).unwrap(),
    );
    let (at16, at18, at24) = (addr(&b16), addr(&b18), addr(&b24));
    drop((b16, b18, b24));
    let before = a.stats();
    assert_eq!((before.allocated, before.reserved), (0, 58 * R));

    // 16R: its own size, not the larger 18R.
    let x = DeviceBuffer::<u8>::alloc_in(&a, 16 * R).unwrap();
    assert_eq!(addr(&x), at16);
    // 16R again: the 16R block is taken, 18R is within 1/8 of it (16R + 2R).
    let y = DeviceBuffer::<u8>::alloc_in(&a, 16 * R).unwrap();
    assert_eq!(addr(&y), at18);
    let s = a.stats();
    assert_eq!((s.allocated, s.reserved), (32 * R, 58 * R));
    assert_eq!(s.num_device_allocs, before.num_device_allocs);
    // 20R: 24R is 1/5 larger, beyond the slack: a new block.
    let z = DeviceBuffer::<u8>::alloc_in(&a, 20 * R).unwrap();
    assert_ne!(addr(&z), at24);
    let s = a.stats();
    assert_eq!((s.allocated, s.reserved), (52 * R, 78 * R));
    assert_eq!(s.num_device_allocs, before.num_device_allocs + 1);
    // Freeing gives back what was counted, and the 18R block returns to the cache as 18R.
    drop(y);
    assert_eq!(a.stats().allocated, 36 * R);
    let w = DeviceBuffer::<u8>::alloc_in(&a, 18 * R).unwrap();
    assert_eq!(addr(&w), at18);
    drop((x, z, w));
    let s = a.stats();
    assert_eq!((s.allocated, s.reserved), (0, 78 * R));
    a.empty_cache();
    let s = a.stats();
    assert_eq!(s.reserved, 0);
    assert_eq!(s.num_device_allocs, s.num_device_frees);
}

#[test]
fn empty_buffers_are_not_counted() {
    let a = CachingAllocator::new_cpu();
    let e = DeviceBuffer::<f32>::alloc_in(&a, 0).unwrap();
    assert!(e.is_empty());
    assert_eq!(e.as_host_slice().unwrap(), &[] as &[f32]);
    assert_eq!(a.stats().reserved, 0);
}

#[test]
fn out_of_memory_releases_cache_then_reports() {
    // Budget of 4 blocks.
    let a = CachingAllocator::new_cpu_with_limit(Some(4 * R));
    let x = DeviceBuffer::<u8>::alloc_in(&a, 3 * R).unwrap();
    drop(x); // cached: reserved 3R
             // 2R does not fit next to the cached 3R block: the cache is released and the retry fits.
    let y = DeviceBuffer::<u8>::alloc_in(&a, 2 * R).unwrap();
    let s = a.stats();
    assert_eq!(
        (s.allocated, s.reserved, s.num_device_frees),
        (2 * R, 2 * R, 1)
    );
    // 3R more cannot fit even after releasing the (empty) cache.
    let err = DeviceBuffer::<u8>::alloc_in(&a, 3 * R).unwrap_err();
    match err {
        Error::OutOfMemory {
            device,
            requested,
            allocated,
            reserved,
        } => {
            assert_eq!(
                (device, requested, allocated, reserved),
                (Device::Cpu, 3 * R, 2 * R, 2 * R)
            );
        }
        e => panic!("expected OutOfMemory, got {e}"),
    }
    drop(y);
}

#[test]
fn size_overflow_is_an_error() {
    let a = CachingAllocator::new_cpu();
    let err = DeviceBuffer::<f64>::alloc_in(&a, usize::MAX / 4).unwrap_err();
    assert!(matches!(err, Error::SizeOverflow { .. }), "{err}");
    // Byte counts whose rounding (or rounding plus the reuse slack) passes usize::MAX: an
    // error, not a wrapped size or a panic, with a block cached to look through.
    drop(DeviceBuffer::<u8>::alloc_in(&a, 10).unwrap());
    for n in [usize::MAX - 8, usize::MAX / 8 * 7, usize::MAX / 2] {
        let err = DeviceBuffer::<u8>::alloc_in(&a, n).unwrap_err();
        assert!(matches!(err, Error::SizeOverflow { .. }), "{n}: {err}");
    }
    assert_eq!(round_size(usize::MAX - 8), usize::MAX);
    assert_eq!(a.stats().allocated, 0);
}

#[test]
fn npu_allocator_without_npu_support_is_typed_error() {
    // This process's NPU tests run on the CANN `select_for_tests` picks (the emulator here):
    // loading CANN before that choice would pin the process to the installed one and fail
    // the tests that select the emulator, depending on which test the harness ran first.
    #[cfg(feature = "npu")]
    let _ = cannon_sys::emulator::select_for_tests();
    if cfg!(feature = "npu") && cannon_sys::is_available() {
        return; // a real NPU allocator: the outcome depends on the machine's devices
    }
    for err in [
        Device::Npu(0).allocator().unwrap_err(),
        Device::Npu(0).private_allocator().unwrap_err(),
    ] {
        if cfg!(feature = "npu") {
            // Built with NPU support but CANN cannot be loaded: the loader's error, not a panic.
            assert!(!matches!(err, Error::NotCompiled { .. }), "{err}");
        } else {
            assert!(matches!(err, Error::NotCompiled { .. }), "{err}");
        }
    }
}

#[test]
fn a_private_allocator_counts_its_own_allocations_only() {
    let shared = Device::Cpu.allocator().unwrap();
    let (a, b) = (
        Device::Cpu.private_allocator().unwrap(),
        Device::Cpu.private_allocator().unwrap(),
    );
    assert!(!Arc::ptr_eq(&a, &shared) && !Arc::ptr_eq(&a, &b));
    assert_eq!(a.device(), Device::Cpu);
    let x = DeviceBuffer::<f32>::alloc_in(&a, 1000).unwrap();
    assert_eq!(a.stats().allocated, round_size(4000));
    assert_eq!(b.stats(), MemoryStats::default());
    drop(x);
    assert_eq!(a.stats().allocated, 0);
}

#[test]
fn the_process_wide_cpu_allocator_is_shared() {
    let a = Device::Cpu.allocator().unwrap();
    let b = Device::Cpu.allocator().unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(a.device(), Device::Cpu);
}

/// Streams change nothing on the host: the same script through stream-tagged allocations
/// (two streams, buffers recorded on the other) gives the figures and the block addresses
/// of the untagged one, and a block freed on one stream is served to the other at once.
#[test]
fn streams_do_not_change_cpu_figures_or_reuse() {
    fn script(a: &Arc<CachingAllocator>, tagged: bool) -> (Vec<MemoryStats>, Vec<usize>) {
        let (s1, s2) = (Stream::cpu(), Stream::cpu());
        let alloc = |s: &Stream, n: usize| {
            if tagged {
                DeviceBuffer::<f32>::alloc_on(a, s, n).unwrap()
            } else {
                DeviceBuffer::<f32>::alloc_in(a, n).unwrap()
            }
        };
        let (mut seen, mut addrs) = (Vec::new(), Vec::new());
        let x = alloc(&s1, 1000);
        let y = alloc(&s2, 100);
        x.record_stream(&s2).unwrap();
        addrs.extend([x.as_raw_ptr() as usize, y.as_raw_ptr() as usize]);
        seen.push(a.stats());
        drop(x);
        seen.push(a.stats());
        let z = alloc(&s2, 1024); // same rounded size as x, other stream
        addrs.push(z.as_raw_ptr() as usize);
        seen.push(a.stats());
        drop((y, z));
        a.empty_cache();
        seen.push(a.stats());
        (seen, addrs)
    }
    let (plain, tagged) = (CachingAllocator::new_cpu(), CachingAllocator::new_cpu());
    let (want, plain_addrs) = script(&plain, false);
    let (got, addrs) = script(&tagged, true);
    assert_eq!(got, want);
    assert_eq!(
        addrs[2], addrs[0],
        "x's block went to the other stream at once"
    );
    assert_eq!(plain_addrs[2], plain_addrs[0]);
    assert_eq!(got[2].num_device_allocs, 2);
    assert!(tagged.take_drop_errors().is_empty());
}

/// Needs an NPU stream: the installed CANN or the emulator (`select_for_tests`).
#[cfg(feature = "npu")]
#[test]
fn a_stream_of_another_device_is_a_typed_error() {
    if let Err(e) = cannon_sys::emulator::select_for_tests() {
        panic!("{e}");
    }
    let a = CachingAllocator::new_cpu();
    let npu = Stream::new(Device::Npu(0)).unwrap();
    let err = DeviceBuffer::<f32>::alloc_on(&a, &npu, 4).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { .. }), "{err}");
    let x = DeviceBuffer::<f32>::alloc_in(&a, 4).unwrap();
    let err = x.record_stream(&npu).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { .. }), "{err}");
}

/// A bounded CPU cache is trimmed before it grows: what is reserved stays within
/// 1 + 1/HOST_RESERVE_SLACK of the most ever allocated, however many shapes were freed, while
/// blocks of a steady size are still served from the cache.
#[test]
fn a_bounded_host_cache_stays_within_its_slack_of_the_high_water() {
    const K: usize = 1024;
    let a = CachingAllocator::new_cpu();
    a.bound_cache(HOST_RESERVE_SLACK);
    let alloc_n = |n: usize, bytes: usize| -> Vec<DeviceBuffer<u8>> {
        (0..n)
            .map(|_| DeviceBuffer::<u8>::alloc_in(&a, bytes).unwrap())
            .collect()
    };
    let high = 8 * 64 * K;
    drop(alloc_n(8, 64 * K));
    assert_eq!(a.stats().reserved, high, "freed blocks stay cached");
    let limit = high + high / HOST_RESERVE_SLACK;
    // New shapes, one after the other: without trimming the cache would hold them all.
    for bytes in [32 * K, 48 * K, 40 * K, 24 * K] {
        let held = alloc_n(8, bytes);
        let s = a.stats();
        assert!(
            s.reserved <= limit && s.reserved >= s.allocated,
            "{bytes} B blocks: reserved {} allocated {} limit {limit}",
            s.reserved,
            s.allocated
        );
        drop(held);
    }
    assert!(a.stats().num_device_frees > 0, "the cache was trimmed");
    // A steady size is reused from the cache: no new host block.
    let held = alloc_n(4, 24 * K);
    drop(held);
    let before = a.stats().num_device_allocs;
    drop(alloc_n(4, 24 * K));
    assert_eq!(a.stats().num_device_allocs, before);
    // A request above the high water grows it: the limit follows.
    let big = alloc_n(1, 2 * high);
    assert!(a.stats().reserved >= 2 * high);
    drop(big);
    // After `empty_cache` the bound starts again from what is allocated (a save or export
    // after the step): a later phase of smaller blocks is held to its own high water, not the
    // step's.
    a.empty_cache();
    assert_eq!(a.stats().reserved, 0);
    let small = 4 * 16 * K;
    drop(alloc_n(4, 16 * K));
    for bytes in [8 * K, 12 * K, 10 * K] {
        let held = alloc_n(4, bytes);
        let s = a.stats();
        let limit = small + small / HOST_RESERVE_SLACK;
        assert!(
            s.reserved <= limit,
            "{bytes} B blocks after empty_cache: reserved {} limit {limit}",
            s.reserved
        );
        drop(held);
    }
}
