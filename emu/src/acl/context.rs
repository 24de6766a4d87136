//! Devices and contexts: `aclrtSetDevice` binds a device (and its default context) to the
//! calling thread; contexts are handles naming a device; a thread's current context decides
//! where memory, streams and a null `aclrtStream` go.

use super::{guard_init, write_out};
use crate::device;
use crate::error::{EmuError, EmuResult};
use crate::handle::Registry;
use cannon_sys::acl::{
    aclError, aclrtContext, ACL_ERROR_INVALID_PARAM, ACL_ERROR_RT_CONTEXT_NULL,
    ACL_ERROR_RT_INVALID_DEVICEID,
};
use parking_lot::Mutex;
use std::cell::Cell;
use std::sync::OnceLock;

/// A context: the device it belongs to, and whether it is that device's default context
/// (which `aclrtSetDevice` creates and `aclrtDestroyContext` must not destroy).
pub struct Context {
    pub device: u32,
    pub is_default: bool,
}

/// Contexts by handle.
pub static CONTEXTS: Registry<Context> =
    Registry::new("aclrtContext", cannon_sys::acl::ACL_ERROR_INVALID_PARAM);

thread_local! {
    /// The calling thread's current context handle (0: none).
    static CURRENT_CONTEXT: Cell<usize> = const { Cell::new(0) };
}

/// Per device: how many `aclrtSetDevice` calls are not yet matched by `aclrtResetDevice`, and
/// the default context handle while the device is set.
struct DeviceState {
    refs: u32,
    default_context: usize,
}

fn states() -> &'static Vec<Mutex<DeviceState>> {
    static S: OnceLock<Vec<Mutex<DeviceState>>> = OnceLock::new();
    S.get_or_init(|| {
        (0..crate::mem::device_count())
            .map(|_| {
                Mutex::new(DeviceState {
                    refs: 0,
                    default_context: 0,
                })
            })
            .collect()
    })
}

/// Validates a device id argument.
pub fn check_device_id(deviceId: i32) -> EmuResult<u32> {
    let n = crate::mem::device_count();
    u32::try_from(deviceId)
        .ok()
        .filter(|&d| d < n)
        .ok_or_else(|| {
            EmuError::new(
                ACL_ERROR_RT_INVALID_DEVICEID,
                format!(
                    "device id {deviceId} is not in 0..{n} (CANNON_EMU_DEVICES sets the count)"
                ),
            )
        })
}

fn make_current(ctx: usize, device: u32) {
    CURRENT_CONTEXT.with(|c| c.set(ctx));
    device::set_current(device);
}

#[no_mangle]
pub extern "C" fn aclrtSetDevice(deviceId: i32) -> aclError {
    guard_init("aclrtSetDevice", || {
        let d = check_device_id(deviceId)?;
        let mut st = states()[d as usize].lock();
        if st.refs == 0 {
            st.default_context = CONTEXTS.insert(Context {
                device: d,
                is_default: true,
            });
        }
        st.refs += 1;
        make_current(st.default_context, d);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn aclrtResetDevice(deviceId: i32) -> aclError {
    guard_init("aclrtResetDevice", || {
        let d = check_device_id(deviceId)?;
        let mut st = states()[d as usize].lock();
        if st.refs == 0 {
            return Err(EmuError::new(
                ACL_ERROR_RT_INVALID_DEVICEID,
                format!("aclrtResetDevice({d}) without a matching aclrtSetDevice"),
            ));
        }
        // acl_rt.h: aclrtResetDevice resets "the current operating Device" of the caller.
        // Whether or not other references keep the device's resources alive, the calling
        // thread is no longer bound to it: both views of its binding (the current context
        // and `crate::device`'s current device, which HCCL and null streams read) are
        // cleared, so a later call needing a device fails with CONTEXT_NULL instead of
        // quietly using the reset device.
        let was_current = CURRENT_CONTEXT.with(|c| c.get()) == st.default_context;
        st.refs -= 1;
        if st.refs == 0 {
            // The default context goes with the last reset; queued work finishes first.
            device::synchronize_device(d);
            let _ = CONTEXTS.remove(st.default_context);
            st.default_context = 0;
        }
        if was_current {
            CURRENT_CONTEXT.with(|c| c.set(0));
            device::clear_current();
        }
        Ok(())
    })
}

/// # Safety
/// `deviceId` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetDevice(deviceId: *mut i32) -> aclError {
    guard_init("aclrtGetDevice", || {
        let d = current_device()?;
        // SAFETY: the caller's out-pointer.
        unsafe { write_out(deviceId, "deviceId", d as i32) }
    })
}

/// # Safety
/// `count` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetDeviceCount(count: *mut u32) -> aclError {
    guard_init("aclrtGetDeviceCount", || {
        // SAFETY: the caller's out-pointer.
        unsafe { write_out(count, "count", crate::mem::device_count()) }
    })
}

#[no_mangle]
pub extern "C" fn aclrtSynchronizeDevice() -> aclError {
    guard_init("aclrtSynchronizeDevice", || {
        let d = current_device()?;
        device::synchronize_device_checked(d)
    })
}

/// The calling thread's device: its current context's, which must still be live.
pub fn current_device() -> EmuResult<u32> {
    let ctx = CURRENT_CONTEXT.with(|c| c.get());
    if ctx == 0 {
        return Err(EmuError::new(
            ACL_ERROR_RT_CONTEXT_NULL,
            "no current context on this thread: call aclrtSetDevice or aclrtSetCurrentContext first",
        ));
    }
    let c = CONTEXTS.get(ctx).map_err(|_| {
        EmuError::new(
            ACL_ERROR_RT_CONTEXT_NULL,
            "this thread's current context was destroyed (aclrtDestroyContext / aclrtResetDevice)",
        )
    })?;
    // Keep crate::device's view (default streams) in step with the context.
    device::set_current(c.device);
    Ok(c.device)
}

/// # Safety
/// `context` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn aclrtCreateContext(context: *mut aclrtContext, deviceId: i32) -> aclError {
    guard_init("aclrtCreateContext", || {
        let d = check_device_id(deviceId)?;
        if context.is_null() {
            return Err(EmuError::new(
                ACL_ERROR_INVALID_PARAM,
                "context is a null pointer",
            ));
        }
        let h = CONTEXTS.insert(Context {
            device: d,
            is_default: false,
        });
        // As in CANN, the new context becomes the calling thread's current one.
        make_current(h, d);
        // SAFETY: checked non-null; the caller's out-pointer.
        unsafe { write_out(context, "context", h as aclrtContext) }
    })
}

#[no_mangle]
pub extern "C" fn aclrtDestroyContext(context: aclrtContext) -> aclError {
    guard_init("aclrtDestroyContext", || {
        let h = context as usize;
        if CONTEXTS.get(h)?.is_default {
            return Err(EmuError::new(
                ACL_ERROR_INVALID_PARAM,
                "the default context of a device is released by aclrtResetDevice, not aclrtDestroyContext",
            ));
        }
        CONTEXTS.remove(h)?;
        if CURRENT_CONTEXT.with(|c| c.get()) == h {
            CURRENT_CONTEXT.with(|c| c.set(0));
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn aclrtSetCurrentContext(context: aclrtContext) -> aclError {
    guard_init("aclrtSetCurrentContext", || {
        let h = context as usize;
        let c = CONTEXTS.get(h)?;
        make_current(h, c.device);
        Ok(())
    })
}

/// # Safety
/// `context` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetCurrentContext(context: *mut aclrtContext) -> aclError {
    guard_init("aclrtGetCurrentContext", || {
        current_device()?;
        let h = CURRENT_CONTEXT.with(|c| c.get());
        // SAFETY: the caller's out-pointer.
        unsafe { write_out(context, "context", h as aclrtContext) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::test_support::init;

    // Device 7: no other unit test sets it, so the unmatched reset below is not raced by a
    // concurrent test's reference.
    #[test]
    fn a_new_thread_has_no_device_until_it_sets_one() {
        init();
        std::thread::spawn(|| {
            let mut d = -1;
            // SAFETY: valid out-pointer.
            assert_eq!(unsafe { aclrtGetDevice(&mut d) }, ACL_ERROR_RT_CONTEXT_NULL);
            assert_eq!(aclrtSetDevice(7), 0);
            // SAFETY: valid out-pointer.
            assert_eq!(unsafe { aclrtGetDevice(&mut d) }, 0);
            assert_eq!(d, 7);
            assert_eq!(aclrtSetDevice(99), ACL_ERROR_RT_INVALID_DEVICEID);
            // A second reference (refs 2), then one reset: the device stays alive for the
            // other reference, but this thread is no longer bound to it.
            assert_eq!(aclrtSetDevice(7), 0);
            assert_eq!(aclrtResetDevice(7), 0);
            // SAFETY: valid out-pointer.
            assert_eq!(unsafe { aclrtGetDevice(&mut d) }, ACL_ERROR_RT_CONTEXT_NULL);
            assert!(crate::device::current().is_err(), "device view not cleared");
            assert!(
                crate::device::lookup(0).is_err(),
                "a null stream still resolved to the reset device's default stream"
            );
            // Binding again works, and the last reset releases the device.
            assert_eq!(aclrtSetDevice(7), 0);
            assert_eq!(crate::device::current().ok(), Some(7));
            assert_eq!(aclrtResetDevice(7), 0);
            assert!(crate::device::current().is_err());
            assert_eq!(aclrtResetDevice(7), 0);
            assert_eq!(aclrtResetDevice(7), ACL_ERROR_RT_INVALID_DEVICEID);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn contexts_switch_devices_and_the_default_one_is_not_destroyable() {
        init();
        std::thread::spawn(|| {
            assert_eq!(aclrtSetDevice(1), 0);
            let mut def: aclrtContext = std::ptr::null_mut();
            // SAFETY: valid out-pointers throughout.
            unsafe {
                assert_eq!(aclrtGetCurrentContext(&mut def), 0);
                let mut c: aclrtContext = std::ptr::null_mut();
                assert_eq!(aclrtCreateContext(&mut c, 2), 0);
                let mut d = -1;
                assert_eq!(aclrtGetDevice(&mut d), 0);
                assert_eq!(d, 2);
                assert_eq!(aclrtSetCurrentContext(def), 0);
                assert_eq!(aclrtGetDevice(&mut d), 0);
                assert_eq!(d, 1);
                assert_eq!(aclrtDestroyContext(def), ACL_ERROR_INVALID_PARAM);
                assert_eq!(aclrtDestroyContext(c), 0);
                assert_eq!(aclrtDestroyContext(c), ACL_ERROR_INVALID_PARAM);
            }
            assert_eq!(aclrtResetDevice(1), 0);
        })
        .join()
        .unwrap();
    }
}
