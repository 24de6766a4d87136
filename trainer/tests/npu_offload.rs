//! Activation offload on an NPU (`--features npu`; the CANN emulator when the machine has no
//! CANN): tensors go to pinned host memory on the host pool's copy stream and come back
//! bit for bit, with the compute stream and the copy stream ordered by events (the emulator
//! runs each stream on its own thread, so a missing wait reads stale bytes).
#![cfg(feature = "npu")]

use cannon_runtime::Device;
use cannon_trainer::model::Exec;

fn exec() -> Exec {
    cannon_sys::emulator::select_for_tests().unwrap();
    Exec::new(Device::Npu(0)).unwrap().with_host_pool().unwrap()
}

#[test]
fn offloaded_tensors_come_back_bit_for_bit_through_pinned_memory() {
    let exec = exec();
    let st = exec.stream();
    let pool = exec.host_pool().unwrap().clone();
    // Sizes on and off the 64-byte alignment of asynchronous copies.
    for n in [16usize, 1000, 4096 + 3] {
        let vals: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let halves: Vec<half::bf16> = vals.iter().map(|&x| half::bf16::from_f32(x)).collect();
        let t = exec.upload(&vals, &[n]).unwrap();
        let b = exec.upload(&halves, &[n]).unwrap();
        let mut ht = pool.offload(st, t).unwrap();
        let mut hb = pool.offload(st, b).unwrap();
        assert!(ht.on_device() && hb.on_device());
        ht.settle().unwrap();
        hb.settle().unwrap();
        assert!(!ht.on_device(), "settle frees the device tensor");
        // The freed blocks are reused and overwritten before the reload.
        let junk = exec.upload(&vec![-7.0f32; n], &[n]).unwrap();
        let t2 = pool.reload(exec.allocator(), st, &ht).unwrap();
        let b2 = pool.reload(exec.allocator(), st, &hb).unwrap();
        let mark = pool.mark().unwrap();
        pool.wait(st, &mark).unwrap();
        assert_eq!(t2.to_host(st).unwrap(), vals, "{n} f32 values");
        assert_eq!(b2.to_host(st).unwrap(), halves, "{n} bf16 values");
        drop(junk);
    }
}
