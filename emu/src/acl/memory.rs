//! Memory: `aclrtMalloc`/`aclrtFree` on the emulated device memory ([`crate::mem`]), pinned
//! host memory (`aclrtMallocHost`), copies and memsets.
//!
//! Copies check that each pointer really is where `kind` says: a host pointer given as a device
//! address, or a device address given as host memory, is `ACL_ERROR_INVALID_PARAM` naming the
//! argument; device ranges must lie inside one live allocation; `count <= destMax`.
//!
//! `aclrtMemcpyAsync` follows CANN's documentation of the call:
//! - with pinned host memory (from `aclrtMallocHost`) or device-to-device it only queues the
//!   copy: the bytes move when the stream's worker reaches it, so reading without a
//!   synchronise shows the old bytes (the bug the emulator exists to show);
//! - with ordinary (unpinned) host memory the call returns after the copy has run (hicann/runtime
//!   docs/api_docs/aclrtMemcpyAsync.md: "when the host memory is not page-locked the call
//!   returns after the copy task completes"; the older CANN 8.0 page called that undefined);
//! - `ACL_MEMCPY_HOST_TO_HOST` is `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (same page);
//! - both addresses must be 64-byte aligned (CANN 8.0 aclrtMemcpyAsync constraints,
//!   docs/cann-api.md §0.9); the emulator enforces the stricter of the two documented rules.

use super::context::current_device;
use super::streams::resolve_stream;
use super::{guard_init, write_out};
use crate::error::{EmuError, EmuResult};
use crate::mem;
use cannon_sys::acl::*;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::ffi::c_void;

/// `aclrtMemcpyAsync`'s address alignment (see the module docs).
pub const ASYNC_ALIGN: usize = 64;

fn invalid(msg: impl Into<String>) -> EmuError {
    EmuError::new(ACL_ERROR_INVALID_PARAM, msg)
}

/// # Safety
/// `devPtr` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn aclrtMalloc(
    devPtr: *mut *mut c_void,
    size: usize,
    policy: aclrtMemMallocPolicy,
) -> aclError {
    guard_init("aclrtMalloc", || {
        check_policy(policy)?;
        if devPtr.is_null() {
            return Err(invalid("devPtr is a null pointer"));
        }
        let d = current_device()?;
        let p = mem::alloc(d, size)?;
        // SAFETY: checked non-null; the caller's out-pointer.
        unsafe { write_out(devPtr, "devPtr", p as *mut c_void) }
    })
}

/// The policy is one base value (`ACL_MEM_MALLOC_*`, 0..=7) OR-ed with the documented flags.
fn check_policy(policy: aclrtMemMallocPolicy) -> EmuResult<()> {
    let flags = ACL_MEM_TYPE_LOW_BAND_WIDTH
        | ACL_MEM_TYPE_HIGH_BAND_WIDTH
        | ACL_MEM_ACCESS_USER_SPACE_READONLY;
    let base = policy & !flags;
    let both_bands = ACL_MEM_TYPE_LOW_BAND_WIDTH | ACL_MEM_TYPE_HIGH_BAND_WIDTH;
    if base > ACL_MEM_MALLOC_HUGE1G_ONLY_P2P || policy & both_bands == both_bands {
        return Err(invalid(format!(
            "policy {policy:#x} is not an aclrtMemMallocPolicy (a base value 0..=7 with at most one band-width flag)"
        )));
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn aclrtFree(devPtr: *mut c_void) -> aclError {
    guard_init("aclrtFree", || {
        if devPtr.is_null() {
            return Err(invalid("devPtr is a null pointer"));
        }
        let a = devPtr as usize;
        if is_pinned(a) {
            return Err(invalid(format!(
                "{a:#x} is pinned host memory: free it with aclrtFreeHost"
            )));
        }
        mem::free(a)
    })
}

/// One `aclrtMallocHost` block.
struct Pinned {
    len: usize,
    layout: std::alloc::Layout,
}

/// Live pinned blocks by start address.
static PINNED: Mutex<BTreeMap<usize, Pinned>> = Mutex::new(BTreeMap::new());

/// Page alignment for pinned blocks (what a page-locked allocation gives on the host).
const PINNED_ALIGN: usize = 4096;

fn is_pinned(addr: usize) -> bool {
    PINNED.lock().contains_key(&addr)
}

/// True when `[addr, addr + len)` lies inside one live pinned block.
pub fn pinned_range(addr: usize, len: usize) -> bool {
    let p = PINNED.lock();
    p.range(..=addr)
        .next_back()
        .is_some_and(|(&s, b)| addr.checked_add(len).is_some_and(|e| e <= s + b.len))
}

/// # Safety
/// `hostPtr` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn aclrtMallocHost(hostPtr: *mut *mut c_void, size: usize) -> aclError {
    guard_init("aclrtMallocHost", || {
        if hostPtr.is_null() {
            return Err(invalid("hostPtr is a null pointer"));
        }
        if size == 0 {
            return Err(invalid("size must be > 0"));
        }
        let layout = std::alloc::Layout::from_size_align(size, PINNED_ALIGN)
            .map_err(|e| invalid(format!("size {size}: {e}")))?;
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return Err(EmuError::new(
                ACL_ERROR_RT_MEMORY_ALLOCATION,
                format!("pinned host memory of {size} bytes could not be allocated"),
            ));
        }
        // New memory holds 0xFF bytes like device memory, so unwritten bytes show up.
        // SAFETY: fresh block of `size` bytes.
        unsafe { std::ptr::write_bytes(p, 0xFF, size) };
        PINNED
            .lock()
            .insert(p as usize, Pinned { len: size, layout });
        // SAFETY: checked non-null; the caller's out-pointer.
        unsafe { write_out(hostPtr, "hostPtr", p.cast()) }
    })
}

#[no_mangle]
pub extern "C" fn aclrtFreeHost(hostPtr: *mut c_void) -> aclError {
    guard_init("aclrtFreeHost", || {
        if hostPtr.is_null() {
            return Err(invalid("hostPtr is a null pointer"));
        }
        let a = hostPtr as usize;
        let Some(b) = PINNED.lock().remove(&a) else {
            return Err(invalid(format!(
                "{a:#x} is not the start of a block from aclrtMallocHost"
            )));
        };
        // SAFETY: allocated in aclrtMallocHost with this layout; removed from the registry.
        unsafe { std::alloc::dealloc(hostPtr.cast(), b.layout) };
        Ok(())
    })
}

/// Which side each pointer of a copy is on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Host,
    Device,
}

fn sides(kind: aclrtMemcpyKind, dst: usize, src: usize) -> EmuResult<(Side, Side)> {
    use Side::*;
    Ok(match kind {
        ACL_MEMCPY_HOST_TO_HOST => (Host, Host),
        ACL_MEMCPY_HOST_TO_DEVICE | ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE => (Device, Host),
        ACL_MEMCPY_DEVICE_TO_HOST => (Host, Device),
        ACL_MEMCPY_DEVICE_TO_DEVICE
        | ACL_MEMCPY_INNER_DEVICE_TO_DEVICE
        | ACL_MEMCPY_INTER_DEVICE_TO_DEVICE => (Device, Device),
        // DEFAULT: the runtime infers the direction from the addresses (unified addressing).
        ACL_MEMCPY_DEFAULT => {
            let side = |a| if mem::is_device(a) { Device } else { Host };
            (side(dst), side(src))
        }
        _ => return Err(invalid(format!("kind {kind} is not an aclrtMemcpyKind"))),
    })
}

/// Checks a pointer against the side `kind` says it is on.
fn check_side(name: &str, addr: usize, side: Side, len: usize) -> EmuResult<()> {
    if addr == 0 {
        return Err(invalid(format!("{name} is a null pointer")));
    }
    match side {
        Side::Host if mem::is_device(addr) => Err(invalid(format!(
            "{name} {addr:#x} is device memory but the copy kind says host memory"
        ))),
        Side::Host => Ok(()),
        Side::Device if !mem::is_device(addr) => Err(invalid(format!(
            "{name} {addr:#x} is not device memory (a host pointer passed where the copy kind says device memory)"
        ))),
        Side::Device => mem::resolve(addr, len).map(|_| ()).map_err(|e| {
            EmuError::new(e.code, format!("{name}: {}", e.message))
        }),
    }
}

/// A validated copy, run now or on a stream.
#[derive(Clone, Copy)]
struct Transfer {
    dst: usize,
    src: usize,
    count: usize,
    dst_side: Side,
    src_side: Side,
}

impl Transfer {
    fn new(
        dst: *mut c_void,
        dest_max: usize,
        src: *const c_void,
        count: usize,
        kind: aclrtMemcpyKind,
    ) -> EmuResult<Transfer> {
        let (dst, src) = (dst as usize, src as usize);
        let (dst_side, src_side) = sides(kind, dst, src)?;
        if count > dest_max {
            return Err(invalid(format!("count {count} exceeds destMax {dest_max}")));
        }
        check_side("dst", dst, dst_side, count)?;
        check_side("src", src, src_side, count)?;
        if kind == ACL_MEMCPY_INNER_DEVICE_TO_DEVICE && mem::owner(dst)? != mem::owner(src)? {
            return Err(invalid(
                "ACL_MEMCPY_INNER_DEVICE_TO_DEVICE between two devices",
            ));
        }
        if kind == ACL_MEMCPY_INTER_DEVICE_TO_DEVICE && mem::owner(dst)? == mem::owner(src)? {
            return Err(invalid(
                "ACL_MEMCPY_INTER_DEVICE_TO_DEVICE within one device",
            ));
        }
        Ok(Transfer {
            dst,
            src,
            count,
            dst_side,
            src_side,
        })
    }

    fn host_ptr(addr: usize, side: Side, len: usize) -> EmuResult<*mut u8> {
        match side {
            Side::Host => Ok(addr as *mut u8),
            Side::Device => mem::resolve(addr, len),
        }
    }

    /// Moves the bytes. Device ranges are resolved again here, so memory freed between
    /// queuing and running is an error rather than a write into a dead block.
    ///
    /// # Safety
    /// The host side is valid for `count` bytes (the C caller's contract; pinned blocks are
    /// re-checked by the async path before this runs).
    unsafe fn run(&self) -> EmuResult<()> {
        if self.count == 0 {
            return Ok(());
        }
        let d = Self::host_ptr(self.dst, self.dst_side, self.count)?;
        let s = Self::host_ptr(self.src, self.src_side, self.count)?;
        // SAFETY: both ranges are valid for `count` bytes (resolved device blocks, or the
        // caller's host memory); `copy` tolerates overlap within one allocation.
        unsafe { std::ptr::copy(s, d, self.count) };
        Ok(())
    }
}

/// # Safety
/// Host-side pointers are valid for `count` bytes.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemcpy(
    dst: *mut c_void,
    destMax: usize,
    src: *const c_void,
    count: usize,
    kind: aclrtMemcpyKind,
) -> aclError {
    guard_init("aclrtMemcpy", || {
        let c = Transfer::new(dst, destMax, src, count, kind)?;
        // SAFETY: the caller's contract on host pointers.
        unsafe { c.run() }
    })
}

/// # Safety
/// Host-side pointers are valid for `count` bytes until the stream has run the copy.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemcpyAsync(
    dst: *mut c_void,
    destMax: usize,
    src: *const c_void,
    count: usize,
    kind: aclrtMemcpyKind,
    stream: aclrtStream,
) -> aclError {
    guard_init("aclrtMemcpyAsync", || {
        if kind == ACL_MEMCPY_HOST_TO_HOST {
            return Err(EmuError::new(
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                "aclrtMemcpyAsync does not copy host to host",
            ));
        }
        let c = Transfer::new(dst, destMax, src, count, kind)?;
        if c.dst_side == Side::Host && c.src_side == Side::Host {
            return Err(EmuError::new(
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                "aclrtMemcpyAsync does not copy host to host (ACL_MEMCPY_DEFAULT on two host pointers)",
            ));
        }
        for (name, addr) in [("dst", c.dst), ("src", c.src)] {
            if addr % ASYNC_ALIGN != 0 {
                return Err(invalid(format!(
                    "{name} {addr:#x} is not {ASYNC_ALIGN}-byte aligned, as aclrtMemcpyAsync requires"
                )));
            }
        }
        let s = resolve_stream(stream)?;
        let host = [(c.dst, c.dst_side), (c.src, c.src_side)]
            .into_iter()
            .find(|&(_, side)| side == Side::Host)
            .map(|(a, _)| a);
        let pinned = host.is_none_or(|a| pinned_range(a, c.count));
        let job = move || {
            if let (true, Some(a)) = (pinned, host) {
                if !pinned_range(a, c.count) {
                    return Err(invalid(format!(
                        "pinned host block at {a:#x} was freed (aclrtFreeHost) before the stream ran the copy"
                    )));
                }
            }
            // SAFETY: host memory is pinned and re-checked live just now, or (unpinned) the
            // caller is blocked below until this job has run.
            unsafe { c.run() }
        };
        if pinned {
            s.enqueue(Box::new(job))?;
            return Ok(());
        }
        // Unpinned host memory: queued in stream order, then waited for (see module docs).
        let (tx, rx) = std::sync::mpsc::channel();
        s.enqueue(Box::new(move || {
            let r = job();
            let _ = tx.send(r.clone());
            r
        }))?;
        rx.recv().unwrap_or_else(|_| {
            // The job was skipped because an earlier job of the stream failed.
            Err(EmuError::new(
                ACL_ERROR_RT_FAILURE,
                "the copy did not run: an earlier task of the stream failed (see aclrtSynchronizeStream)",
            ))
        })
    })
}

fn memset_args(dev: *mut c_void, max: usize, count: usize) -> EmuResult<usize> {
    if count > max {
        return Err(invalid(format!("count {count} exceeds maxCount {max}")));
    }
    check_side("devPtr", dev as usize, Side::Device, count)?;
    Ok(dev as usize)
}

fn fill(addr: usize, value: i32, count: usize) -> EmuResult<()> {
    if count == 0 {
        return Ok(());
    }
    let p = mem::resolve(addr, count)?;
    // CANN fills bytes (value's low byte), like memset.
    // SAFETY: resolved range of `count` bytes.
    unsafe { std::ptr::write_bytes(p, value as u8, count) };
    Ok(())
}

#[no_mangle]
pub extern "C" fn aclrtMemset(
    devPtr: *mut c_void,
    maxCount: usize,
    value: i32,
    count: usize,
) -> aclError {
    guard_init("aclrtMemset", || {
        let a = memset_args(devPtr, maxCount, count)?;
        fill(a, value, count)
    })
}

#[no_mangle]
pub extern "C" fn aclrtMemsetAsync(
    devPtr: *mut c_void,
    maxCount: usize,
    value: i32,
    count: usize,
    stream: aclrtStream,
) -> aclError {
    guard_init("aclrtMemsetAsync", || {
        let a = memset_args(devPtr, maxCount, count)?;
        let s = resolve_stream(stream)?;
        s.enqueue(Box::new(move || fill(a, value, count)))?;
        Ok(())
    })
}

/// # Safety
/// `free` and `total` are null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetMemInfo(
    attr: aclrtMemAttr,
    free: *mut usize,
    total: *mut usize,
) -> aclError {
    guard_init("aclrtGetMemInfo", || {
        if attr > ACL_MEM_P2P_HUGE1G {
            return Err(invalid(format!("attr {attr} is not an aclrtMemAttr")));
        }
        let d = current_device()?;
        // The emulated device has one kind of memory: every attribute reports it (DDR
        // included, as an A2/A3 reports its HBM; callers ask for ACL_HBM_MEM).
        let (used, cap) = mem::usage(d)?;
        // SAFETY: the caller's out-pointers.
        unsafe {
            write_out(free, "free", cap.saturating_sub(used) as usize)?;
            write_out(total, "total", cap as usize)
        }
    })
}
