//! Offload on an NPU (`--features npu`; the CANN emulator when the machine has no CANN):
//! buffers go to pinned host memory on the host pool's copy stream and come back bit for
//! bit, with the compute stream and the copy stream ordered by events (the emulator runs
//! each stream on its own thread, so a missing wait reads stale bytes).
#![cfg(feature = "npu")]

use cannon_runtime::{Device, DeviceBuffer, HostPool, Stream};

#[test]
fn offloaded_buffers_come_back_bit_for_bit_through_pinned_memory() {
    cannon_sys::emulator::select_for_tests().unwrap();
    let device = Device::Npu(0);
    let st = &Stream::new(device).unwrap();
    let alloc = device.allocator().unwrap();
    let pool = HostPool::new(device).unwrap();
    // Sizes on and off the 64-byte alignment of asynchronous copies.
    for n in [16usize, 1000, 4096 + 3] {
        let vals: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let halves: Vec<half::bf16> = vals.iter().map(|&x| half::bf16::from_f32(x)).collect();
        let t = DeviceBuffer::clone_htod(st, &vals).unwrap();
        let b = DeviceBuffer::clone_htod(st, &halves).unwrap();
        let mut ht = pool.offload(st, t, &[n]).unwrap();
        let mut hb = pool.offload(st, b, &[n]).unwrap();
        assert!(ht.on_device() && hb.on_device());
        ht.settle().unwrap();
        hb.settle().unwrap();
        assert!(!ht.on_device(), "settle frees the device buffer");
        // The freed blocks are reused and overwritten before the reload.
        let junk = DeviceBuffer::clone_htod(st, &vec![-7.0f32; n]).unwrap();
        let t2 = pool.reload(&alloc, st, &ht).unwrap();
        let b2 = pool.reload(&alloc, st, &hb).unwrap();
        let mark = pool.mark().unwrap();
        pool.wait(st, &mark).unwrap();
        assert_eq!(t2.clone_dtoh(st).unwrap(), vals, "{n} f32 values");
        assert_eq!(b2.clone_dtoh(st).unwrap(), halves, "{n} bf16 values");
        drop(junk);
    }
}
