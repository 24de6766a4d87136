//! Emulated device memory.
//!
//! Each device owns a slice of one reserved, inaccessible address range (`mmap(PROT_NONE)`):
//! the addresses `aclrtMalloc` hands out point there, so a host read or write through a device
//! pointer faults at once instead of quietly working as it would with plain host memory. The
//! bytes live in a separate host block per allocation, reached only through [`resolve`], which
//! checks that the whole range lies inside one live allocation of that device.
//!
//! New memory is filled with `0xFF` bytes (NaN in f32 and bf16), so reading memory that was
//! never written shows up in results rather than reading as zeros.

use crate::error::{EmuError, EmuResult};
use cannon_sys::acl::{ACL_ERROR_INVALID_PARAM, ACL_ERROR_RT_MEMORY_ALLOCATION};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// Devices the emulator shows (`CANNON_EMU_DEVICES`, default 8: an Atlas 800T A2 host).
pub fn device_count() -> u32 {
    static N: OnceLock<u32> = OnceLock::new();
    *N.get_or_init(|| env_u64("CANNON_EMU_DEVICES", 8).clamp(1, MAX_DEVICES as u64) as u32)
}

/// Bytes each device offers (`CANNON_EMU_DEVICE_MEMORY_MIB`, default 16 GiB); beyond it
/// `aclrtMalloc` fails with `ACL_ERROR_RT_MEMORY_ALLOCATION`, so out-of-memory paths are testable.
pub fn device_capacity() -> u64 {
    static C: OnceLock<u64> = OnceLock::new();
    *C.get_or_init(|| {
        let span = space().map_or(DEVICE_SPAN, |s| s.span);
        (env_u64("CANNON_EMU_DEVICE_MEMORY_MIB", 16 * 1024) << 20).min(span as u64)
    })
}

fn env_u64(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const MAX_DEVICES: usize = 16;
/// Address space per device (reserved, never backed): 64 GiB, or less where the process may
/// not reserve 1 TiB (valgrind, `ulimit -v`): halved down to [`MIN_DEVICE_SPAN`].
const DEVICE_SPAN: usize = 64 << 30;
const MIN_DEVICE_SPAN: usize = 1 << 30;
/// Every allocation starts on this boundary (CANN's own is at least 32 bytes; ops require 32).
pub const ALIGN: usize = 512;

/// One live allocation: its size and its host backing.
struct Block {
    len: usize,
    host: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: the host block is owned by the registry and only reached through `resolve`, whose
// callers follow CANN's rule that a stream's work and the host do not race on one range.
unsafe impl Send for Block {}

struct DeviceMem {
    /// Live allocations by start address.
    live: BTreeMap<usize, Block>,
    /// Free address ranges by start address (first fit, coalesced on free).
    free: BTreeMap<usize, usize>,
    in_use: u64,
}

struct Space {
    base: usize,
    /// Address space per device (see DEVICE_SPAN).
    span: usize,
    devices: Vec<Mutex<DeviceMem>>,
}

fn space() -> EmuResult<&'static Space> {
    static SPACE: OnceLock<Result<Space, String>> = OnceLock::new();
    SPACE
        .get_or_init(|| {
            let mut span = DEVICE_SPAN;
            let p = loop {
                let len = span * MAX_DEVICES;
                // SAFETY: an anonymous PROT_NONE reservation; nothing is ever mapped readable in
                // it, which is the point (a host access through a device pointer faults).
                let p = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        len,
                        libc::PROT_NONE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                        -1,
                        0,
                    )
                };
                if p != libc::MAP_FAILED {
                    break p;
                }
                if span == MIN_DEVICE_SPAN {
                    return Err(format!(
                        "cannot reserve {len} bytes of address space for device memory: {}",
                        std::io::Error::last_os_error()
                    ));
                }
                span /= 2;
            };
            let base = (p as usize).next_multiple_of(ALIGN);
            let devices = (0..MAX_DEVICES)
                .map(|d| {
                    let start = base + d * span;
                    Mutex::new(DeviceMem {
                        live: BTreeMap::new(),
                        free: BTreeMap::from([(start, span - ALIGN)]),
                        in_use: 0,
                    })
                })
                .collect();
            Ok(Space {
                base,
                span,
                devices,
            })
        })
        .as_ref()
        .map_err(|m| EmuError::new(ACL_ERROR_RT_MEMORY_ALLOCATION, m.clone()))
}

fn device(d: u32) -> EmuResult<&'static Mutex<DeviceMem>> {
    if d >= device_count() {
        return Err(EmuError::new(
            ACL_ERROR_INVALID_PARAM,
            format!(
                "device {d} does not exist (the emulator shows {})",
                device_count()
            ),
        ));
    }
    Ok(&space()?.devices[d as usize])
}

/// Allocates `size` bytes on device `d` (`aclrtMalloc`): a fresh device address, `ALIGN`-aligned,
/// backed by host memory filled with `0xFF`.
pub fn alloc(d: u32, size: usize) -> EmuResult<usize> {
    if size == 0 {
        return Err(EmuError::new(ACL_ERROR_INVALID_PARAM, "size must be > 0"));
    }
    let mut m = device(d)?.lock();
    let rounded = size.next_multiple_of(ALIGN);
    if m.in_use + rounded as u64 > device_capacity() {
        return Err(EmuError::new(
            ACL_ERROR_RT_MEMORY_ALLOCATION,
            format!(
                "out of device memory on device {d}: {size} bytes asked, {} of {} in use",
                m.in_use,
                device_capacity()
            ),
        ));
    }
    let Some((&start, &len)) = m.free.iter().find(|(_, &len)| len >= rounded) else {
        return Err(EmuError::new(
            ACL_ERROR_RT_MEMORY_ALLOCATION,
            format!("device {d}: address space fragmented, no range of {rounded} bytes"),
        ));
    };
    let layout = std::alloc::Layout::from_size_align(rounded, 64)
        .map_err(|e| EmuError::new(ACL_ERROR_INVALID_PARAM, e.to_string()))?;
    // SAFETY: non-zero size (rounded >= ALIGN).
    let host = unsafe { std::alloc::alloc(layout) };
    if host.is_null() {
        return Err(EmuError::new(
            ACL_ERROR_RT_MEMORY_ALLOCATION,
            format!("host backing of {rounded} bytes for device {d} could not be allocated"),
        ));
    }
    // SAFETY: `host` is a fresh block of `rounded` bytes.
    unsafe { std::ptr::write_bytes(host, 0xFF, rounded) };
    m.free.remove(&start);
    if len > rounded {
        m.free.insert(start + rounded, len - rounded);
    }
    m.live.insert(
        start,
        Block {
            len: size,
            host,
            layout,
        },
    );
    m.in_use += rounded as u64;
    Ok(start)
}

/// Frees an allocation by its start address (`aclrtFree`); anything else is an error.
pub fn free(addr: usize) -> EmuResult<()> {
    let d = owner(addr)?;
    let mut m = device(d)?.lock();
    let Some(block) = m.live.remove(&addr) else {
        return Err(EmuError::new(
            ACL_ERROR_INVALID_PARAM,
            format!("{addr:#x} is not the start of a live allocation on device {d}"),
        ));
    };
    // SAFETY: allocated in `alloc` with this layout and removed from the registry just now.
    unsafe { std::alloc::dealloc(block.host, block.layout) };
    let rounded = block.layout.size();
    m.in_use -= rounded as u64;
    // Coalesce with the free neighbours.
    let (mut start, mut len) = (addr, rounded);
    if let Some((&ps, &pl)) = m.free.range(..start).next_back() {
        if ps + pl == start {
            m.free.remove(&ps);
            start = ps;
            len += pl;
        }
    }
    if let Some(&nl) = m.free.get(&(addr + rounded)) {
        m.free.remove(&(addr + rounded));
        len += nl;
    }
    m.free.insert(start, len);
    Ok(())
}

/// The device whose address range holds `addr`, or an error naming it a host pointer.
pub fn owner(addr: usize) -> EmuResult<u32> {
    let s = space()?;
    if addr < s.base || addr >= s.base + s.span * MAX_DEVICES {
        return Err(EmuError::new(
            ACL_ERROR_INVALID_PARAM,
            format!("{addr:#x} is not device memory (a host pointer passed where CANN expects device memory?)"),
        ));
    }
    Ok(((addr - s.base) / s.span) as u32)
}

/// True when `addr` lies in the emulated device address range.
pub fn is_device(addr: usize) -> bool {
    owner(addr).is_ok()
}

/// The host bytes behind device range `[addr, addr + len)`, which must lie inside one live
/// allocation. The pointer stays valid until that allocation is freed; resolve inside the stream
/// job that uses it, not when the job is queued, so a free in between is caught.
pub fn resolve(addr: usize, len: usize) -> EmuResult<*mut u8> {
    let d = owner(addr)?;
    let m = device(d)?.lock();
    let Some((&start, block)) = m.live.range(..=addr).next_back() else {
        return Err(EmuError::new(
            ACL_ERROR_INVALID_PARAM,
            format!("{addr:#x} on device {d} is not inside a live allocation"),
        ));
    };
    let end = addr
        .checked_add(len)
        .ok_or_else(|| EmuError::new(ACL_ERROR_INVALID_PARAM, "range end overflows".to_string()))?;
    if end > start + block.len {
        return Err(EmuError::new(
            ACL_ERROR_INVALID_PARAM,
            format!(
                "[{addr:#x}, +{len}) on device {d} runs past its allocation [{start:#x}, +{})",
                block.len
            ),
        ));
    }
    // SAFETY: `addr - start < block.len`, inside the host block.
    Ok(unsafe { block.host.add(addr - start) })
}

/// Bytes in use on device `d` and its capacity (`aclrtGetMemInfo`).
pub fn usage(d: u32) -> EmuResult<(u64, u64)> {
    Ok((device(d)?.lock().in_use, device_capacity()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_resolve_free_and_reuse() {
        let a = alloc(0, 100).unwrap();
        assert_eq!(a % ALIGN, 0);
        assert!(is_device(a));
        let p = resolve(a + 10, 90).unwrap();
        // SAFETY: inside the block just resolved.
        assert_eq!(unsafe { *p }, 0xFF);
        assert!(resolve(a + 10, 91).is_err(), "past the end");
        free(a).unwrap();
        assert!(resolve(a, 1).is_err(), "after free");
        assert!(free(a).is_err(), "double free");
    }

    #[test]
    fn host_pointers_are_not_device_memory() {
        let v = [0u8; 16];
        let e = resolve(v.as_ptr() as usize, 16).unwrap_err();
        assert!(e.message.contains("not device memory"), "{e}");
    }

    #[test]
    fn devices_do_not_share_addresses() {
        let a = alloc(0, 64).unwrap();
        let b = alloc(1, 64).unwrap();
        assert_eq!(owner(a).unwrap(), 0);
        assert_eq!(owner(b).unwrap(), 1);
        free(a).unwrap();
        free(b).unwrap();
        assert!(alloc(device_count(), 64).is_err());
    }
}
