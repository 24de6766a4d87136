//! The runtime's NPU path run for real against the host emulation of CANN
//! (`cannon-cann-emu`): buffers of every dtype, views, the caching allocator on aclrtMalloc,
//! streams and events, pinned host buffers, typed errors carrying aclGetRecentErrMsg, and the
//! bugs the emulator exists to show (a host pointer given as device memory, a misaligned
//! address, a read without synchronise).
//!
//! Every test calls `npu()` first, which picks the CANN before the first CANN call of this test
//! binary: an installed CANN when one loads (an Ascend host: the same tests then check the
//! hardware), else the emulator cargo built (the test fails, saying how to build it, when it
//! is missing). Checks that need the emulator itself (its test hook, its messages) say that
//! they skip on real hardware. Tests run in parallel threads, so each uses its own device
//! ordinal and the process-wide allocator figures of one test are not disturbed by another.

#![cfg(feature = "npu")]

use cannon_runtime::npu::{result, PinnedHostBuffer};
use cannon_runtime::{CachingAllocator, DType, Device, DeviceBuffer, Element, Error, Stream};
use cannon_sys::acl;
use half::bf16;
use std::ffi::c_void;
use std::time::Duration;

/// Picks the CANN to test against; true when it is the emulator.
fn npu() -> bool {
    match cannon_sys::emulator::select_for_tests() {
        Ok(c) => c.is_emulator(),
        Err(e) => panic!("{e}"),
    }
}

/// For checks that need the emulator: false (and a note) on real hardware.
fn emulator_only(what: &str) -> bool {
    let emu = npu();
    if !emu {
        eprintln!("skipped on the installed CANN (needs the emulator): {what}");
    }
    emu
}

/// The emulator's test hook (not a CANN function): holds a stream's worker before its next
/// task, so a test can see work that was queued but has not run.
fn hold(stream: &Stream, on: bool) {
    type Hold = unsafe extern "C" fn(acl::aclrtStream, i32) -> acl::aclError;
    let lib = cannon_sys::loader::library(cannon_sys::Lib::AscendCl).unwrap();
    let f = lib.symbol(c"cannon_emu_stream_hold").unwrap();
    // SAFETY: the emulator exports the hook with this signature.
    let f: Hold = unsafe { std::mem::transmute::<*mut c_void, Hold>(f.as_ptr()) };
    let raw = stream.acl_stream().unwrap().raw();
    // SAFETY: a live stream handle.
    assert_eq!(unsafe { f(raw, on as i32) }, 0);
}

fn round_trip<T: Element + std::fmt::Debug + PartialEq>(d: Device, make: impl Fn(usize) -> T) {
    let s = Stream::new(d).unwrap();
    let host: Vec<T> = (0..1000).map(make).collect();
    let a = DeviceBuffer::clone_htod(&s, &host).unwrap();
    assert_eq!(a.device(), d);
    let mut b = DeviceBuffer::<T>::alloc_zeros(&s, host.len()).unwrap();
    b.memcpy_dtod(&s, &a.view()).unwrap();
    assert_eq!(b.clone_dtoh(&s).unwrap(), host, "{}", T::DTYPE);
}

#[test]
fn every_dtype_round_trips_host_device_device_host() {
    npu();
    let d = Device::Npu(0);
    round_trip::<f32>(d, |i| i as f32 * 0.5 - 7.0);
    round_trip::<bf16>(d, |i| bf16::from_f32(i as f32 * 0.25 - 3.0));
    round_trip::<f64>(d, |i| i as f64 / 3.0);
    round_trip::<i32>(d, |i| i as i32 * -3);
    round_trip::<i64>(d, |i| (i as i64) << 33);
    round_trip::<u32>(d, |i| i as u32 * 7 + 1);
    round_trip::<u8>(d, |i| (i * 13) as u8);
    // Every dtype the runtime knows was covered above.
    assert_eq!(DType::ALL.len(), 7);
}

#[test]
fn views_copy_sub_ranges_at_any_offset() {
    npu();
    let s = Stream::new(Device::Npu(1)).unwrap();
    let host: Vec<f32> = (0..300).map(|i| i as f32).collect();
    let a = DeviceBuffer::clone_htod(&s, &host).unwrap();
    let mut b = DeviceBuffer::<f32>::alloc_zeros(&s, 300).unwrap();
    // Offsets 3 and 17 are not 64-byte aligned: the runtime copies those synchronously.
    b.slice_mut(17..117)
        .unwrap()
        .memcpy_dtod(&s, &a.slice(3..103).unwrap())
        .unwrap();
    // An aligned pair (offset 16 f32 = 64 bytes) goes through aclrtMemcpyAsync.
    b.slice_mut(160..260)
        .unwrap()
        .memcpy_dtod(&s, &a.slice(16..116).unwrap())
        .unwrap();
    b.slice_mut(290..300)
        .unwrap()
        .memcpy_htod(&s, &[9.0; 10])
        .unwrap();
    let mut want = vec![0f32; 300];
    want[17..117].copy_from_slice(&host[3..103]);
    want[160..260].copy_from_slice(&host[16..116]);
    want[290..300].fill(9.0);
    assert_eq!(b.clone_dtoh(&s).unwrap(), want);
    assert_eq!(
        b.slice(160..170).unwrap().clone_dtoh(&s).unwrap(),
        host[16..26]
    );
    b.slice_mut(0..20).unwrap().memset_zeros(&s).unwrap();
    assert_eq!(b.clone_dtoh(&s).unwrap()[..20], [0.0; 20]);
}

fn mem_used(ordinal: u32) -> usize {
    let s = Stream::new(Device::Npu(ordinal)).unwrap(); // binds the device on this thread
    drop(s);
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers; the device is bound.
    let r = unsafe { acl::aclrtGetMemInfo(acl::ACL_HBM_MEM, &mut free, &mut total) };
    result::check("aclrtGetMemInfo", r).unwrap();
    total - free
}

/// The same allocation sequence on an allocator; its figures after each step.
fn allocation_script(alloc: &std::sync::Arc<CachingAllocator>) -> Vec<cannon_runtime::MemoryStats> {
    let mut seen = Vec::new();
    let a = DeviceBuffer::<f32>::alloc_in(alloc, 100).unwrap();
    let b = DeviceBuffer::<bf16>::alloc_in(alloc, 3000).unwrap();
    seen.push(alloc.stats());
    assert_eq!(a.as_raw_ptr() as usize % 32, 0, "32-byte aligned blocks");
    assert_eq!(b.as_raw_ptr() as usize % 32, 0, "32-byte aligned blocks");
    drop(a);
    seen.push(alloc.stats());
    let c = DeviceBuffer::<u8>::alloc_in(alloc, 400).unwrap(); // cache hit (512-byte block)
    seen.push(alloc.stats());
    alloc.reset_peak();
    drop(b);
    seen.push(alloc.stats());
    alloc.empty_cache();
    seen.push(alloc.stats());
    drop(c);
    seen.push(alloc.stats());
    seen
}

#[test]
fn allocator_statistics_match_the_cpu_and_the_device_sees_the_reservation() {
    let emu = npu();
    let npu = Device::Npu(2).allocator().unwrap();
    let before = mem_used(2);
    let on_npu = allocation_script(&npu);
    let on_cpu = allocation_script(&CachingAllocator::new_cpu());
    assert_eq!(on_npu, on_cpu, "statistics as on the CPU");
    // The first step's reservation is exactly what the emulated device reports in use
    // (blocks are multiples of 512 bytes, as the emulator's allocations).
    assert_eq!(on_npu[0].reserved, 512 + 6144);
    if !emu {
        // CANN pads and rounds its own allocations; the exact match below is the emulator's.
        eprintln!("skipped on the installed CANN: device-side figures");
        return;
    }
    let still = npu.stats().reserved;
    assert_eq!(mem_used(2) - before, still);
    npu.empty_cache();
    assert_eq!(mem_used(2), before);
}

#[test]
fn an_event_orders_two_streams_and_times_the_work_between_records() {
    if !emulator_only("an_event_orders_two_streams_and_times_the_work_between_records") {
        return;
    }
    let d = Device::Npu(3);
    let (a, b) = (Stream::new(d).unwrap(), Stream::new(d).unwrap());
    let host: Vec<f32> = (0..4096).map(|i| i as f32).collect();
    let src = DeviceBuffer::clone_htod(&a, &host).unwrap();
    let mut mid = DeviceBuffer::<f32>::alloc_zeros(&a, host.len()).unwrap();
    let mut out = DeviceBuffer::<f32>::alloc_zeros(&b, host.len()).unwrap();
    a.synchronize().unwrap();
    b.synchronize().unwrap();

    let start = a.record().unwrap();
    start.synchronize().unwrap();
    hold(&a, true);
    mid.memcpy_dtod(&a, &src.view()).unwrap(); // queued on a, held
    let done = a.record().unwrap();
    b.wait(&done).unwrap();
    out.memcpy_dtod(&b, &mid.view()).unwrap(); // queued on b behind the wait
    std::thread::sleep(Duration::from_millis(30));
    // b has not run past the wait: `out` still holds zeros (a synchronous copy reads it now).
    let mut peek = vec![1f32; host.len()];
    // SAFETY: out is a live device buffer of host.len() f32; peek is a host buffer as long.
    unsafe {
        result::memcpy(
            peek.as_mut_ptr().cast(),
            out.as_raw_ptr().cast(),
            host.len() * 4,
            result::ACL_MEMCPY_DEVICE_TO_HOST,
        )
    }
    .unwrap();
    assert!(peek.iter().all(|&x| x == 0.0), "b ran before a's event");
    hold(&a, false);
    assert_eq!(out.clone_dtoh(&b).unwrap(), host);
    done.synchronize().unwrap();
    let ms = start.elapsed_ms(&done).unwrap();
    assert!(
        ms >= 25.0,
        "the 30 ms hold lies between the two events: {ms} ms"
    );
}

#[test]
fn pinned_buffers_carry_async_copies_both_ways() {
    npu();
    let d = Device::Npu(4);
    let s = Stream::new(d).unwrap();
    let host: Vec<i64> = (0..2000).map(|i| i * i - 5).collect();
    let mut up = PinnedHostBuffer::from_slice(4, &host).unwrap();
    let mut dev = DeviceBuffer::<i64>::alloc_zeros(&s, host.len()).unwrap();
    dev.memcpy_htod_async(&s, &mut up).unwrap();
    let mut down = PinnedHostBuffer::<i64>::new(4, host.len()).unwrap();
    dev.memcpy_dtoh_async(&s, &mut down).unwrap();
    // Reading waits for the queued copy (the buffer recorded an event).
    assert_eq!(down.as_slice().unwrap(), &host[..]);
    // A view at an unaligned offset takes the synchronous path, same result.
    let mut part = PinnedHostBuffer::<i64>::new(4, 10).unwrap();
    dev.slice(3..13)
        .unwrap()
        .memcpy_dtoh_async(&s, &mut part)
        .unwrap();
    assert_eq!(part.as_slice().unwrap(), &host[3..13]);
    // Lengths and devices are checked.
    let err = dev.memcpy_dtoh_async(&s, &mut part).unwrap_err();
    assert!(matches!(err, Error::Length { .. }), "{err}");
    let mut other = PinnedHostBuffer::<i64>::new(5, host.len()).unwrap();
    let err = dev.memcpy_dtoh_async(&s, &mut other).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { .. }), "{err}");
}

#[test]
fn a_read_without_synchronise_sees_the_old_bytes_and_the_synchronised_read_the_new() {
    if !emulator_only(
        "a_read_without_synchronise_sees_the_old_bytes_and_the_synchronised_read_the_new",
    ) {
        return;
    }
    let d = Device::Npu(5);
    let s = Stream::new(d).unwrap();
    let host: Vec<f32> = (0..1024).map(|i| i as f32 + 0.5).collect();
    let dev = DeviceBuffer::clone_htod(&s, &host).unwrap();
    let bytes = host.len() * 4;
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the device is bound by Stream::new on this thread.
    result::check("aclrtMallocHost", unsafe {
        acl::aclrtMallocHost(&mut p, bytes)
    })
    .unwrap();
    let poison = f32::from_bits(0x7fc0_dead);
    // SAFETY: p is a pinned block of `bytes`, 4096-byte aligned.
    let pinned = unsafe { std::slice::from_raw_parts_mut(p.cast::<f32>(), host.len()) };
    pinned.fill(poison);
    hold(&s, true);
    // SAFETY: both ranges are live and 64-byte aligned; the block outlives the copy.
    unsafe {
        result::memcpy_async(
            p,
            dev.as_raw_ptr().cast(),
            bytes,
            result::ACL_MEMCPY_DEVICE_TO_HOST,
            s.acl_stream().unwrap().raw(),
        )
    }
    .unwrap();
    // The bug: the call returned, the copy has not run.
    // SAFETY: the stream is held, so nothing writes the block while we read it.
    let early = unsafe { std::slice::from_raw_parts(p.cast::<f32>(), host.len()) };
    assert!(early.iter().all(|x| x.to_bits() == poison.to_bits()));
    hold(&s, false);
    s.synchronize().unwrap();
    // SAFETY: the copy has finished.
    let late = unsafe { std::slice::from_raw_parts(p.cast::<f32>(), host.len()) };
    assert_eq!(late, &host[..]);
    // SAFETY: p came from aclrtMallocHost and nothing uses it any more.
    result::check("aclrtFreeHost", unsafe { acl::aclrtFreeHost(p) }).unwrap();
}

#[test]
fn a_host_pointer_as_device_memory_is_a_typed_error_with_the_emulators_message() {
    if !emulator_only("a_host_pointer_as_device_memory_is_a_typed_error_with_the_emulators_message")
    {
        return;
    }
    let s = Stream::new(Device::Npu(6)).unwrap();
    let dev = DeviceBuffer::<u8>::alloc_zeros(&s, 256).unwrap();
    let mut host = vec![0u8; 256];
    // SAFETY: the emulator rejects the host destination before touching memory.
    let err = unsafe {
        result::memcpy(
            host.as_mut_ptr().cast(),
            dev.as_raw_ptr().cast(),
            256,
            result::ACL_MEMCPY_HOST_TO_DEVICE,
        )
    }
    .unwrap_err();
    let Error::Acl {
        call,
        code,
        name,
        message,
    } = &err
    else {
        panic!("expected Error::Acl, got {err:?}");
    };
    assert_eq!(
        (*call, *code, *name),
        ("aclrtMemcpy", 100000, "ACL_ERROR_INVALID_PARAM")
    );
    assert!(message.contains("not device memory"), "{message}");
    assert!(message.contains("dst"), "names the argument: {message}");
}

#[test]
fn a_misaligned_async_address_is_a_typed_error() {
    if !emulator_only("a_misaligned_async_address_is_a_typed_error") {
        return;
    }
    let s = Stream::new(Device::Npu(6)).unwrap();
    let dev = DeviceBuffer::<u8>::alloc_zeros(&s, 256).unwrap();
    let pinned = PinnedHostBuffer::<u8>::new(6, 64).unwrap();
    let pinned_addr = pinned.as_slice().unwrap().as_ptr();
    // SAFETY: rejected before any byte moves (device address 32 bytes into the block).
    let err = unsafe {
        result::memcpy_async(
            dev.as_raw_ptr().add(32) as *mut c_void,
            pinned_addr.cast(),
            64,
            result::ACL_MEMCPY_HOST_TO_DEVICE,
            s.acl_stream().unwrap().raw(),
        )
    }
    .unwrap_err();
    assert!(
        matches!(&err, Error::Acl { call: "aclrtMemcpyAsync", code: 100000, message, .. }
            if message.contains("64-byte aligned")),
        "{err}"
    );
}

#[test]
fn a_device_that_does_not_exist_is_a_typed_error_with_the_message() {
    if !emulator_only("a_device_that_does_not_exist_is_a_typed_error_with_the_message") {
        return;
    }
    let err = Stream::new(Device::Npu(99)).unwrap_err();
    assert!(
        matches!(&err, Error::Acl { call: "aclrtSetDevice", code: 107001, message, .. }
            if message.contains("device id 99")),
        "{err}"
    );
    assert_eq!(
        Device::npu_count(),
        8,
        "the emulator shows 8 devices by default"
    );
}
