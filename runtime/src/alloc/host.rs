//! Host memory for the CPU's caching allocator.
//!
//! Small blocks come from the global allocator. Blocks of [`HUGE_BLOCK`] bytes and more are
//! anonymous mappings of their own, starting on a 2 MiB boundary and marked
//! `MADV_HUGEPAGE`: a model's tensors are GB in all, and with 4 KiB pages their first touch
//! costs one fault per 4 KiB (about half of a 1B model's start-up went to faults that way,
//! its state being 13.7 GB); a 2 MiB-aligned mapping under `madvise` THP (the usual default)
//! faults in 2 MiB pages, 512 times fewer. A fresh mapping holds zeros, and
//! [`RawMemory::prefault_zeroed`] makes it resident in one call (`MADV_POPULATE_WRITE`), so
//! a buffer of zeros is the kernel's one pass over its pages instead of a fault per page
//! followed by a `memset` of the same bytes.
//!
//! Both kinds are counted in the allocating thread's host bytes ([`crate::host_count`]) as
//! the global allocator counts its own, so the per-thread figures do not depend on where a
//! block came from.

use super::raw::{RawMemory, BLOCK_ALIGN};
use crate::error::{Error, Result};
use parking_lot::Mutex;

/// Blocks of at least this many bytes are mapped on their own, on a boundary of this many
/// bytes (the x86-64 and aarch64 4 KiB-granule huge page).
pub const HUGE_BLOCK: usize = 2 << 20;

/// Whether a block of `bytes` is mapped on its own. Not under Miri: it models a mapping as one
/// allocation and cannot give part of it back, as [`map::huge`] does with the unaligned head
/// and tail (valid POSIX); there every block takes the global allocator's path, which Miri
/// checks, and the mapped path is left to the tests and AddressSanitizer.
fn is_huge(bytes: usize) -> bool {
    bytes >= HUGE_BLOCK && !cfg!(miri)
}

/// Host memory with an optional capacity (for tests and for modelling a device budget on the
/// CPU).
pub(crate) struct HostMemory {
    pub(crate) limit: Option<usize>,
    pub(crate) in_use: Mutex<usize>,
}

impl RawMemory for HostMemory {
    fn raw_alloc(&self, bytes: usize) -> Result<Option<*mut u8>> {
        let mut in_use = self.in_use.lock();
        if self.limit.is_some_and(|l| *in_use + bytes > l) {
            return Ok(None);
        }
        // Checked for both kinds: a size no layout takes is an error, not an OOM.
        let layout = small_layout(bytes, "host allocation")?;
        let ptr = if is_huge(bytes) {
            match map::huge(bytes) {
                Some(p) => p,
                None => return Ok(None),
            }
        } else {
            // SAFETY: `bytes` is non-zero (the allocator never asks for empty blocks) and
            // the layout is valid; zeroed memory makes every later read of a Pod value
            // defined.
            let p = unsafe { std::alloc::alloc_zeroed(layout) };
            if p.is_null() {
                return Ok(None);
            }
            p
        };
        if is_huge(bytes) {
            // The global allocator counted the small block itself.
            crate::host_count::count_outside(bytes as isize);
        }
        *in_use += bytes;
        Ok(Some(ptr))
    }

    unsafe fn raw_free(&self, ptr: *mut u8, bytes: usize) -> Result<()> {
        if is_huge(bytes) {
            // SAFETY: the caller guarantees ptr came from raw_alloc(bytes), which mapped
            // blocks of this size with map::huge(bytes), and is freed once.
            unsafe { map::unmap(ptr, bytes) }.map_err(|source| Error::HostMemory {
                call: "munmap",
                bytes,
                source,
            })?;
            crate::host_count::count_outside(-(bytes as isize));
        } else {
            let layout = small_layout(bytes, "host free")?;
            // SAFETY: the caller guarantees ptr came from raw_alloc(bytes), i.e. from
            // alloc_zeroed with this same layout, and is freed once.
            unsafe { std::alloc::dealloc(ptr, layout) };
        }
        *self.in_use.lock() -= bytes;
        Ok(())
    }

    fn prefault_zeroed(&self, ptr: *mut u8, bytes: usize) -> bool {
        // Small blocks come zeroed from the global allocator, but possibly from memory it
        // reused (already resident): writing their zeros again costs little.
        is_huge(bytes) && map::populate(ptr, bytes)
    }
}

fn small_layout(bytes: usize, what: &'static str) -> Result<std::alloc::Layout> {
    std::alloc::Layout::from_size_align(bytes, BLOCK_ALIGN).map_err(|_| Error::SizeOverflow {
        what,
        len: bytes,
        elem: 1,
    })
}

/// The `mmap` edge: every `unsafe` call of the huge-block path.
mod map {
    use super::HUGE_BLOCK;
    use std::io;

    /// The mapped length of a block of `bytes`: whole 4 KiB pages. Not rounded to 2 MiB: the
    /// tail past the last 2 MiB boundary stays in small pages, so a block's resident bytes
    /// are its own (a 3 MiB block would otherwise hold 4 MiB once touched).
    fn mapped_len(bytes: usize) -> Option<usize> {
        Some(bytes.checked_add(4095)? & !4095)
    }

    /// A new private anonymous mapping of `bytes` (zeros, not yet resident) starting on a
    /// 2 MiB boundary and advised for huge pages, or `None` when the kernel refuses it
    /// (out of memory or address space: the caller's retry-then-OOM path).
    pub(super) fn huge(bytes: usize) -> Option<*mut u8> {
        let len = mapped_len(bytes)?;
        // Over-reserve by one huge page so that an aligned start exists inside, then give
        // back the unaligned head and the tail.
        let reserve = len.checked_add(HUGE_BLOCK)?;
        // SAFETY: a fresh anonymous private mapping at an address the kernel picks touches
        // no existing memory; the arguments are valid constants and a non-zero length.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let base = base as usize;
        let start = base.next_multiple_of(HUGE_BLOCK);
        let (head, tail) = (start - base, base + reserve - (start + len));
        // SAFETY: both ranges lie inside the mapping just made and outside the block kept;
        // nothing refers to them. Failure would only leave address space mapped (never
        // touched, so never resident): ignored.
        unsafe {
            if head > 0 {
                libc::munmap(base as *mut libc::c_void, head);
            }
            if tail > 0 {
                libc::munmap((start + len) as *mut libc::c_void, tail);
            }
        }
        // SAFETY: advice on the block's own range. Huge pages are a hint: where THP is off
        // (EINVAL) the block works in small pages, so the result is not an error.
        #[cfg(target_os = "linux")]
        unsafe {
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        Some(start as *mut u8)
    }

    /// Faults in every page of a block from [`huge`] for writing (the kernel zeroes them as
    /// it does on a first touch, in one call instead of a fault per page); false when the
    /// kernel cannot (before Linux 5.14: EINVAL), and the block is then as it was.
    #[cfg(target_os = "linux")]
    pub(super) fn populate(ptr: *mut u8, bytes: usize) -> bool {
        let Some(len) = mapped_len(bytes) else {
            return false;
        };
        // SAFETY: `ptr..ptr+len` is one block from `huge(bytes)`, owned by the caller and
        // not yet handed out; populating writes nothing a reader could have seen (its pages
        // are zeros before and after).
        unsafe { libc::madvise(ptr as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) == 0 }
    }

    /// Other systems have no populate call: the caller writes its zeros.
    #[cfg(not(target_os = "linux"))]
    pub(super) fn populate(_ptr: *mut u8, _bytes: usize) -> bool {
        false
    }

    /// Unmaps a block from [`huge`].
    ///
    /// # Safety
    /// `ptr` came from `huge(bytes)` and no reference into the block outlives this call.
    pub(super) unsafe fn unmap(ptr: *mut u8, bytes: usize) -> io::Result<()> {
        let len = mapped_len(bytes).ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: the caller's contract: the whole mapping is the block, and unused.
        match unsafe { libc::munmap(ptr as *mut libc::c_void, len) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mapped block starts on a 2 MiB boundary, reads as zeros, takes writes to its last
    /// byte, is made resident as zeros, and goes back; small blocks keep the global
    /// allocator's path.
    #[test]
    #[cfg_attr(miri, ignore = "no mapped blocks under Miri (see is_huge)")]
    fn huge_blocks_are_aligned_zeroed_and_freed() {
        let mem = HostMemory {
            limit: None,
            in_use: Mutex::new(0),
        };
        for bytes in [
            HUGE_BLOCK,
            HUGE_BLOCK + 512,
            3 * HUGE_BLOCK + 4096 * 3 + 512,
        ] {
            let p = mem.raw_alloc(bytes).unwrap().unwrap();
            assert_eq!(p as usize % HUGE_BLOCK, 0, "{bytes} bytes");
            // Linux 5.14 and later populate; the block is zeros either way.
            let _ = mem.prefault_zeroed(p, bytes);
            // SAFETY: the block is `bytes` long and owned here.
            let s = unsafe { std::slice::from_raw_parts_mut(p, bytes) };
            assert!(s.iter().all(|&b| b == 0));
            s[bytes - 1] = 7;
            assert_eq!(*mem.in_use.lock(), bytes);
            // SAFETY: from raw_alloc(bytes), freed once, `s` not used after.
            unsafe { mem.raw_free(p, bytes) }.unwrap();
            assert_eq!(*mem.in_use.lock(), 0);
        }
        let p = mem.raw_alloc(4096).unwrap().unwrap();
        assert_eq!(p as usize % BLOCK_ALIGN, 0);
        assert!(!mem.prefault_zeroed(p, 4096));
        // SAFETY: from raw_alloc(4096), freed once.
        unsafe { mem.raw_free(p, 4096) }.unwrap();
    }

    /// The limit counts mapped blocks as any other.
    #[test]
    fn the_limit_holds_for_huge_blocks() {
        let mem = HostMemory {
            limit: Some(3 * HUGE_BLOCK),
            in_use: Mutex::new(0),
        };
        let a = mem.raw_alloc(2 * HUGE_BLOCK).unwrap().unwrap();
        assert!(mem.raw_alloc(2 * HUGE_BLOCK).unwrap().is_none());
        // SAFETY: from raw_alloc, freed once.
        unsafe { mem.raw_free(a, 2 * HUGE_BLOCK) }.unwrap();
        let b = mem.raw_alloc(2 * HUGE_BLOCK).unwrap().unwrap();
        // SAFETY: from raw_alloc, freed once.
        unsafe { mem.raw_free(b, 2 * HUGE_BLOCK) }.unwrap();
    }
}
