//! The AscendCL exports called as C would call them (same process, no loader).

use super::context::*;
use super::memory::*;
use super::streams::*;
use super::test_support::init;
use super::*;
use cannon_sys::acl::{
    aclrtEvent, aclrtStream, ACL_ERROR_INVALID_PARAM, ACL_ERROR_REPEAT_INITIALIZE,
    ACL_ERROR_RT_FEATURE_NOT_SUPPORT, ACL_EVENT_RECORDED_STATUS_COMPLETE,
    ACL_EVENT_RECORDED_STATUS_NOT_READY, ACL_HBM_MEM, ACL_MEMCPY_DEVICE_TO_DEVICE,
    ACL_MEMCPY_DEVICE_TO_HOST, ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_HOST_TO_HOST,
    ACL_MEM_MALLOC_HUGE_FIRST,
};
use std::ffi::{c_void, CStr};

/// Runs `f` on a fresh thread bound to device `d` (tests run in parallel; each keeps its own
/// current device).
fn on_device(d: i32, f: impl FnOnce() + Send + 'static) {
    init();
    std::thread::spawn(move || {
        assert_eq!(aclrtSetDevice(d), 0);
        f();
        assert_eq!(aclrtResetDevice(d), 0);
    })
    .join()
    .unwrap();
}

fn recent() -> String {
    let p = aclGetRecentErrMsg();
    assert!(!p.is_null(), "an error message was recorded");
    // SAFETY: non-null, NUL-terminated, valid until the next call on this thread.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn malloc(n: usize) -> *mut c_void {
    let mut p = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(
        unsafe { aclrtMalloc(&mut p, n, ACL_MEM_MALLOC_HUGE_FIRST) },
        0
    );
    p
}

fn pinned(n: usize) -> *mut u8 {
    let mut p = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { aclrtMallocHost(&mut p, n) }, 0);
    p.cast()
}

#[test]
fn init_twice_is_repeat_initialize_and_the_message_says_so() {
    init();
    // SAFETY: null config.
    assert_eq!(
        unsafe { aclInit(std::ptr::null()) },
        ACL_ERROR_REPEAT_INITIALIZE
    );
    let m = recent();
    assert!(m.contains("aclInit") && m.contains("already"), "{m}");
    assert!(aclGetRecentErrMsg().is_null(), "a message is returned once");
    let (mut a, mut b, mut c) = (0, 0, 0);
    // SAFETY: valid out-pointers.
    assert_eq!(unsafe { aclrtGetVersion(&mut a, &mut b, &mut c) }, 0);
    assert_eq!((a, b, c), (1, 17, 0));
}

#[test]
fn copies_check_which_side_each_pointer_is_on() {
    on_device(0, || {
        let d = malloc(256);
        let host = [7u8; 256];
        let mut back = [0u8; 256];
        // SAFETY: valid host buffers of 256 bytes and a live device block.
        unsafe {
            let h = host.as_ptr().cast::<c_void>();
            let b = back.as_mut_ptr().cast::<c_void>();
            assert_eq!(aclrtMemcpy(d, 256, h, 256, ACL_MEMCPY_HOST_TO_DEVICE), 0);
            assert_eq!(aclrtMemcpy(b, 256, d, 256, ACL_MEMCPY_DEVICE_TO_HOST), 0);
            assert_eq!(back, host);
            // Host pointer as the device source.
            let r = aclrtMemcpy(b, 256, h, 256, ACL_MEMCPY_DEVICE_TO_HOST);
            assert_eq!(r, ACL_ERROR_INVALID_PARAM);
            assert!(recent().contains("src"), "names the argument");
            // Device pointer as the host destination.
            let r = aclrtMemcpy(d, 256, d, 256, ACL_MEMCPY_DEVICE_TO_HOST);
            assert_eq!(r, ACL_ERROR_INVALID_PARAM);
            assert!(recent().contains("is device memory"));
            // count > destMax, and a range past the allocation.
            assert_eq!(
                aclrtMemcpy(d, 128, h, 256, ACL_MEMCPY_HOST_TO_DEVICE),
                ACL_ERROR_INVALID_PARAM
            );
            assert_eq!(
                aclrtMemcpy(d.byte_add(128), 256, h, 256, ACL_MEMCPY_HOST_TO_DEVICE),
                ACL_ERROR_INVALID_PARAM
            );
            assert!(recent().contains("runs past"));
            assert_eq!(aclrtMemcpy(b, 256, h, 256, 99), ACL_ERROR_INVALID_PARAM);
            assert_eq!(aclrtMemset(d, 256, 0x41, 256), 0);
            assert_eq!(aclrtMemcpy(b, 256, d, 256, ACL_MEMCPY_DEVICE_TO_HOST), 0);
            assert_eq!(back, [0x41; 256]);
        }
        assert_eq!(aclrtFree(d), 0);
        assert_eq!(aclrtFree(d), ACL_ERROR_INVALID_PARAM, "double free");
    });
}

#[test]
fn malloc_validates_policy_and_size() {
    on_device(1, || {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe {
            assert_eq!(aclrtMalloc(&mut p, 64, 8), ACL_ERROR_INVALID_PARAM);
            assert_eq!(aclrtMalloc(&mut p, 64, 0x1100), ACL_ERROR_INVALID_PARAM);
            assert_eq!(aclrtMalloc(&mut p, 0, 0), ACL_ERROR_INVALID_PARAM);
            assert_eq!(
                aclrtMalloc(std::ptr::null_mut(), 64, 0),
                ACL_ERROR_INVALID_PARAM
            );
            assert_eq!(aclrtMalloc(&mut p, 64, 0x1000 | 2), 0);
        }
        assert_eq!(p as usize % 32, 0);
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        assert_eq!(
            unsafe { aclrtGetMemInfo(ACL_HBM_MEM, &mut free, &mut total) },
            0
        );
        assert!(free < total && total > 0);
        assert_eq!(aclrtFree(p), 0);
    });
}

#[test]
fn async_copies_run_on_the_stream_and_need_pinned_aligned_memory() {
    on_device(2, || {
        let mut s: aclrtStream = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { aclrtCreateStream(&mut s) }, 0);
        let d = malloc(4096);
        let h = pinned(4096);
        // SAFETY: pinned block of 4096 bytes.
        unsafe { std::ptr::write_bytes(h, 3, 4096) };
        assert_eq!(aclrtMemsetAsync(d, 4096, 9, 4096, s), 0);
        assert_eq!(cannon_emu_stream_hold(s, 1), 0);
        // SAFETY: pinned host block and live device block, kept until synchronised.
        unsafe {
            assert_eq!(
                aclrtMemcpyAsync(h.cast(), 4096, d, 4096, ACL_MEMCPY_DEVICE_TO_HOST, s),
                0
            );
            // Restored: the copy has not run, the host still sees its own bytes.
            assert_eq!(*h.add(100), 3);
            assert_eq!(cannon_emu_stream_hold(s, 0), 0);
            assert_eq!(aclrtSynchronizeStream(s), 0);
            assert_eq!(*h.add(100), 9);
            // Misaligned device address.
            let r = aclrtMemcpyAsync(
                h.cast(),
                64,
                d.byte_add(32),
                64,
                ACL_MEMCPY_DEVICE_TO_HOST,
                s,
            );
            assert_eq!(r, ACL_ERROR_INVALID_PARAM);
            assert!(recent().contains("64-byte aligned"));
            let r = aclrtMemcpyAsync(h.cast(), 64, h.cast(), 64, ACL_MEMCPY_HOST_TO_HOST, s);
            assert_eq!(r, ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
            // Unpinned host memory: the call returns after the copy has run.
            let mut v = vec![0u8; 4160];
            let off = v.as_ptr().align_offset(64);
            let dst = v.as_mut_ptr().add(off);
            assert_eq!(
                aclrtMemcpyAsync(dst.cast(), 4096, d, 4096, ACL_MEMCPY_DEVICE_TO_HOST, s),
                0
            );
            assert_eq!(*dst.add(4095), 9);
        }
        assert_eq!(aclrtFreeHost(h.cast()), 0);
        assert_eq!(aclrtFreeHost(h.cast()), ACL_ERROR_INVALID_PARAM);
        assert_eq!(aclrtFree(d), 0);
        assert_eq!(aclrtDestroyStream(s), 0);
        assert_eq!(
            aclrtDestroyStream(s),
            cannon_sys::acl::ACL_ERROR_RT_PARAM_INVALID
        );
    });
}

#[test]
fn a_freed_block_under_a_queued_copy_is_an_error_at_synchronise() {
    on_device(3, || {
        let d = malloc(128);
        let d2 = malloc(128);
        assert_eq!(cannon_emu_stream_hold(std::ptr::null_mut(), 1), 0);
        // SAFETY: live device blocks at queue time.
        unsafe {
            assert_eq!(
                aclrtMemcpyAsync(
                    d2,
                    128,
                    d,
                    128,
                    ACL_MEMCPY_DEVICE_TO_DEVICE,
                    std::ptr::null_mut()
                ),
                0
            );
        }
        assert_eq!(aclrtFree(d), 0);
        assert_eq!(cannon_emu_stream_hold(std::ptr::null_mut(), 0), 0);
        assert_eq!(
            aclrtSynchronizeStream(std::ptr::null_mut()),
            ACL_ERROR_INVALID_PARAM
        );
        assert!(recent().contains("not inside a live allocation"));
        assert_eq!(aclrtFree(d2), 0);
    });
}

#[test]
fn an_event_wait_orders_two_streams_and_times_them() {
    on_device(4, || {
        let (mut a, mut b): (aclrtStream, aclrtStream) =
            (std::ptr::null_mut(), std::ptr::null_mut());
        let (mut e0, mut e1): (aclrtEvent, aclrtEvent) =
            (std::ptr::null_mut(), std::ptr::null_mut());
        let d = malloc(64);
        let h = pinned(64);
        // SAFETY: valid out-pointers, live blocks.
        unsafe {
            assert_eq!(aclrtCreateStream(&mut a), 0);
            assert_eq!(aclrtCreateStream(&mut b), 0);
            assert_eq!(aclrtCreateEvent(&mut e0), 0);
            assert_eq!(aclrtCreateEventWithFlag(&mut e1, 0x8), 0);
            assert_eq!(aclrtRecordEvent(e0, a), 0);
            assert_eq!(aclrtSynchronizeEvent(e0), 0);
            assert_eq!(cannon_emu_stream_hold(a, 1), 0);
            assert_eq!(aclrtMemsetAsync(d, 64, 5, 64, a), 0);
            assert_eq!(aclrtRecordEvent(e1, a), 0);
            let mut st = 9;
            assert_eq!(aclrtQueryEventStatus(e1, &mut st), 0);
            assert_eq!(st, ACL_EVENT_RECORDED_STATUS_NOT_READY);
            // b waits for a's memset, then reads the block.
            assert_eq!(aclrtStreamWaitEvent(b, e1), 0);
            assert_eq!(
                aclrtMemcpyAsync(h.cast(), 64, d, 64, ACL_MEMCPY_DEVICE_TO_HOST, b),
                0
            );
            let mut ms = 0f32;
            assert_ne!(
                aclrtEventElapsedTime(&mut ms, e0, e1),
                0,
                "e1 not complete yet"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert_eq!(*h, 0xFF, "b must not have run past the wait");
            assert_eq!(cannon_emu_stream_hold(a, 0), 0);
            assert_eq!(aclrtSynchronizeStream(b), 0);
            assert_eq!(*h.add(63), 5);
            assert_eq!(aclrtSynchronizeEvent(e1), 0);
            assert_eq!(aclrtQueryEventStatus(e1, &mut st), 0);
            assert_eq!(st, ACL_EVENT_RECORDED_STATUS_COMPLETE);
            assert_eq!(aclrtEventElapsedTime(&mut ms, e0, e1), 0);
            assert!(
                ms >= 15.0,
                "the hold of >= 20 ms lies between the events: {ms}"
            );
            assert_eq!(aclrtDestroyEvent(e0), 0);
            assert_eq!(aclrtDestroyEvent(e1), 0);
            assert_eq!(aclrtDestroyStream(a), 0);
            assert_eq!(aclrtDestroyStream(b), 0);
        }
        assert_eq!(aclrtFreeHost(h.cast()), 0);
        assert_eq!(aclrtFree(d), 0);
    });
}

#[test]
fn out_of_memory_is_the_documented_code() {
    on_device(5, || {
        let mut p = std::ptr::null_mut();
        let cap = crate::mem::device_capacity() as usize;
        // SAFETY: valid out-pointer.
        let r = unsafe { aclrtMalloc(&mut p, cap + 1, ACL_MEM_MALLOC_HUGE_FIRST) };
        assert_eq!(r, cannon_sys::acl::ACL_ERROR_RT_MEMORY_ALLOCATION);
        assert!(recent().contains("out of device memory"));
    });
}

#[test]
fn calls_without_a_device_name_the_missing_call() {
    init();
    std::thread::spawn(|| {
        let mut s: aclrtStream = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let r = unsafe { aclrtCreateStream(&mut s) };
        assert_eq!(r, cannon_sys::acl::ACL_ERROR_RT_CONTEXT_NULL);
        assert!(recent().contains("aclrtSetDevice"));
    })
    .join()
    .unwrap();
}

#[test]
fn device_synchronise_waits_for_every_stream_and_a_timeout_is_reported() {
    on_device(6, || {
        let mut s: aclrtStream = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { aclrtCreateStream(&mut s) }, 0);
        let d = malloc(64);
        assert_eq!(aclrtMemset(d, 64, 1, 64), 0);
        assert_eq!(cannon_emu_stream_hold(s, 1), 0);
        assert_eq!(aclrtMemsetAsync(d, 64, 2, 64, s), 0);
        assert_eq!(
            aclrtSynchronizeStreamWithTimeout(s, 20),
            cannon_sys::acl::ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
        );
        assert_eq!(
            aclrtSynchronizeStreamWithTimeout(s, 0),
            ACL_ERROR_INVALID_PARAM
        );
        let raw = s as usize;
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(30));
            assert_eq!(cannon_emu_stream_hold(raw as aclrtStream, 0), 0);
        });
        // Returns only once the held stream has run its memset.
        assert_eq!(aclrtSynchronizeDevice(), 0);
        let mut back = [0u8; 64];
        // SAFETY: a host buffer and a live device block of 64 bytes.
        let r = unsafe {
            aclrtMemcpy(
                back.as_mut_ptr().cast(),
                64,
                d,
                64,
                ACL_MEMCPY_DEVICE_TO_HOST,
            )
        };
        assert_eq!(r, 0);
        assert_eq!(back, [2u8; 64]);
        release.join().unwrap();
        assert_eq!(aclrtDestroyStream(s), 0);
        assert_eq!(aclrtFree(d), 0);
    });
}
