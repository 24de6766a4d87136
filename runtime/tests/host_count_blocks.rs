//! The CPU allocator's blocks count in the allocating thread's host bytes whichever way the
//! host gives them (the global allocator's small blocks, the large blocks it maps itself),
//! so the per-thread figures a plan is checked against do not depend on a block's size.

use cannon_runtime::alloc::HUGE_BLOCK;
use cannon_runtime::{host_count, CachingAllocator, DeviceBuffer, Stream};

#[global_allocator]
static HOST: host_count::CountingAlloc = host_count::CountingAlloc;

#[test]
fn small_and_mapped_blocks_count_in_the_thread_figures() {
    std::thread::spawn(|| {
        let (s, a) = (Stream::cpu(), CachingAllocator::new_cpu());
        assert!(host_count::installed());
        for bytes in [4096, HUGE_BLOCK, 5 * HUGE_BLOCK + 512] {
            let start = host_count::stats().allocated;
            host_count::reset_peak();
            let b = DeviceBuffer::<u8>::alloc_zeros_on(&a, &s, bytes).unwrap();
            let held = host_count::stats().allocated - start;
            assert_eq!(held, bytes as isize, "{bytes} bytes held");
            drop(b);
            // Cached: still held until the cache is released (beside the cache's own entry
            // for it, a few hundred bytes).
            let cached = host_count::stats().allocated - start - bytes as isize;
            assert!(
                (0..4096).contains(&cached),
                "{bytes} bytes cached: {cached} more"
            );
            a.empty_cache();
            let now = host_count::stats();
            assert_eq!(now.allocated, start, "{bytes} bytes given back");
            assert_eq!(now.peak_allocated - start, bytes as isize + cached);
        }
    })
    .join()
    .unwrap();
}
