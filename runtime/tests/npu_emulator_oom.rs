//! Out of device memory on the emulator (`CANNON_EMU_DEVICE_MEMORY_MIB=1`) is the runtime's
//! typed `Error::OutOfMemory`, after the caching allocator has given its cache back and
//! retried, as torch does. Its own test binary: the capacity is read once per process, and the
//! variable is set before the first CANN call (this binary's only test).

#![cfg(feature = "npu")]

use cannon_runtime::{Device, DeviceBuffer, Error, Stream};

#[test]
fn the_emulators_capacity_is_the_runtimes_typed_oom() {
    std::env::set_var("CANNON_EMU_DEVICE_MEMORY_MIB", "1");
    match cannon_sys::emulator::select_for_tests() {
        Ok(c) if c.is_emulator() => {}
        Ok(_) => {
            eprintln!("skipped on the installed CANN (the capacity is the emulator's)");
            return;
        }
        Err(e) => panic!("{e}"),
    }
    let d = Device::Npu(0);
    let s = Stream::new(d).unwrap();
    let alloc = d.allocator().unwrap();
    const KIB: usize = 1024;

    // More than the device has: OOM naming the device and the request.
    let err = DeviceBuffer::<u8>::alloc(&s, 2 * KIB * KIB).unwrap_err();
    assert!(
        matches!(err, Error::OutOfMemory { device, requested, allocated: 0, reserved: 0 }
            if device == d && requested == 2 * KIB * KIB),
        "{err}"
    );

    // 600 KiB cached, then 700 KiB asked: the first aclrtMalloc fails, the allocator frees
    // its cache and the retry succeeds.
    let a = DeviceBuffer::<u8>::alloc(&s, 600 * KIB).unwrap();
    drop(a);
    assert_eq!(alloc.stats().reserved, 600 * KIB);
    let b = DeviceBuffer::<u8>::alloc(&s, 700 * KIB).unwrap();
    let st = alloc.stats();
    assert_eq!(
        (st.allocated, st.reserved, st.num_device_frees),
        (700 * KIB, 700 * KIB, 1)
    );

    // With 700 KiB live, 400 KiB more cannot fit even after releasing the (empty) cache.
    let err = DeviceBuffer::<u8>::alloc(&s, 400 * KIB).unwrap_err();
    assert!(
        matches!(err, Error::OutOfMemory { allocated, reserved, .. }
            if allocated == 700 * KIB && reserved == 700 * KIB),
        "{err}"
    );
    drop(b);
}
