//! Host allocations counted per thread, as the caching allocator counts a device's: the
//! bytes a thread holds now and its peak since the last [`reset_peak`].
//!
//! The figures come from [`CountingAlloc`], a global allocator over the system's that a
//! binary installs (`#[global_allocator]`; the `cannon` binary does). A rank runs on its own
//! thread, so its host bytes (the host copies of a checkpoint save, the pieces of a read,
//! the group an export writes) are its thread's. Without the allocator installed
//! [`installed`] is false and every figure 0 (the unit test below calls it directly, which
//! also sets the flag for that test binary). An allocation freed on another thread than the
//! one that made it moves the count from one thread to the other: the figures are exact for
//! threads that free what they allocate (a rank's phases do). The CPU allocator's large
//! blocks, which it maps from the kernel itself rather than through the global allocator,
//! are counted here the same way (`count_outside`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

/// A thread's host bytes: held now and at most since its last [`reset_peak`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostStats {
    pub allocated: isize,
    pub peak_allocated: isize,
}

thread_local! {
    // Const-initialised cells without destructors: usable from inside the allocator, also
    // while a thread is being torn down.
    static ALLOCATED: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

static INSTALLED: AtomicBool = AtomicBool::new(false);

/// The system allocator, counting each thread's bytes.
pub struct CountingAlloc;

fn count(delta: isize) {
    // A load first: the flag's cache line stays shared once set.
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
    // `try_with`: a thread's locals may already be gone when its last frees run.
    let _ = ALLOCATED.try_with(|a| {
        let now = a.get() + delta;
        a.set(now);
        let _ = PEAK.try_with(|p| {
            if now > p.get() {
                p.set(now)
            }
        });
    });
}

/// Counts `delta` host bytes the calling thread obtained (positive) or gave back (negative)
/// outside the global allocator: the CPU allocator's large blocks, which it maps itself
/// (`alloc::host`). Nothing is counted in a binary that does not count its allocations, so
/// its figures stay 0 as documented.
pub(crate) fn count_outside(delta: isize) {
    if installed() {
        count(delta);
    }
}

// SAFETY: every call is forwarded to `System` with the same arguments; the counting touches
// only const-initialised thread locals (no allocation, no re-entry).
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is System's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (every path above is).
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as `dealloc`, with System's realloc contract.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        p
    }
}

/// Whether the running binary counts its host allocations (set by the first allocation
/// through [`CountingAlloc`]).
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

/// The calling thread's figures.
pub fn stats() -> HostStats {
    HostStats {
        allocated: ALLOCATED.try_with(Cell::get).unwrap_or(0),
        peak_allocated: PEAK.try_with(Cell::get).unwrap_or(0),
    }
}

/// Starts a new peak at what the calling thread holds now.
pub fn reset_peak() {
    let now = ALLOCATED.try_with(Cell::get).unwrap_or(0);
    let _ = PEAK.try_with(|p| p.set(now));
}

#[cfg(test)]
mod tests {
    // The runtime's unit tests do not install the allocator: these check the counting
    // functions on a thread of their own through the allocator's methods directly.
    use super::*;

    #[test]
    fn a_thread_counts_what_it_holds_and_its_peak() {
        std::thread::spawn(|| {
            let a = CountingAlloc;
            let layout = Layout::from_size_align(1 << 20, 64).unwrap();
            let before = stats();
            // SAFETY: a valid layout; the pointer is freed with it below.
            let p = unsafe { a.alloc(layout) };
            assert!(!p.is_null());
            assert_eq!(stats().allocated - before.allocated, 1 << 20);
            // SAFETY: grown from the layout it was allocated with.
            let p = unsafe { a.realloc(p, layout, 3 << 20) };
            assert!(!p.is_null());
            assert_eq!(stats().allocated - before.allocated, 3 << 20);
            let grown = Layout::from_size_align(3 << 20, 64).unwrap();
            // SAFETY: the current layout of `p`.
            unsafe { a.dealloc(p, grown) };
            let after = stats();
            assert_eq!(after.allocated, before.allocated);
            assert_eq!(after.peak_allocated - before.allocated, 3 << 20);
            reset_peak();
            assert_eq!(stats().peak_allocated, stats().allocated);
        })
        .join()
        .unwrap();
    }
}
