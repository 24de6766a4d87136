//! The host pool on the CPU and meta devices (its NPU path is driven by the trainer's NPU
//! offload tests on the emulator).

use super::{HostPool, HostTensor};
use crate::alloc::CachingAllocator;
use crate::buffer::DeviceBuffer;
use crate::device::Device;
use crate::error::Error;
use crate::stream::Stream;

/// An offload moves the bytes from the device's figures to the pool's once settled, and the
/// reload brings the same values back into a new device buffer.
#[test]
fn offload_settle_reload_round_trip_moves_the_figures() {
    let (st, dev) = (Stream::cpu(), CachingAllocator::new_cpu());
    let pool = HostPool::new(Device::Cpu).unwrap();
    assert_eq!(pool.device(), Device::Cpu);
    let vals: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
    let mut b = DeviceBuffer::<f32>::alloc_in(&dev, vals.len()).unwrap();
    b.memcpy_htod(&st, &vals).unwrap();
    let on_device = dev.stats().allocated;
    assert!(on_device >= 4000);

    let mut h = pool.offload(&st, b, &[10, 100]).unwrap();
    assert_eq!(h.shape(), &[10, 100]);
    assert_eq!(h.numel(), 1000);
    assert!(h.on_device(), "the device buffer is held until settle");
    assert_eq!(dev.stats().allocated, on_device);
    assert_eq!(pool.stats().allocated, on_device);
    h.settle().unwrap();
    assert!(!h.on_device());
    assert_eq!(dev.stats().allocated, 0, "settle frees the device buffer");
    assert_eq!(h.to_vec().unwrap(), vals);

    let back = pool.reload(&dev, &st, &h).unwrap();
    let mark = pool.mark().unwrap();
    pool.wait(&st, &mark).unwrap();
    assert_eq!(back.len(), 1000);
    assert_eq!(back.clone_dtoh(&st).unwrap(), vals);
    assert_eq!(HostPool::staging_slots(Device::Cpu), 1);
    assert_eq!(HostPool::staging_slots(Device::Meta), 2);
}

/// Values kept in the pool are read and written in place: from host values, into and out
/// of device views, and by the host itself, within range.
#[test]
fn kept_values_are_read_and_written_in_place() {
    let (st, dev) = (Stream::cpu(), CachingAllocator::new_cpu());
    let pool = HostPool::new(Device::Cpu).unwrap();
    let mut h = pool.from_values(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    assert_eq!(h.shape(), &[4]);
    assert!(!h.on_device());

    let mut staging = DeviceBuffer::<f32>::alloc_in(&dev, 4).unwrap();
    pool.reload_into(&st, &h, &mut staging.view_mut()).unwrap();
    assert_eq!(staging.clone_dtoh(&st).unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    staging.memcpy_htod(&st, &[5.0, 6.0, 7.0, 8.0]).unwrap();
    pool.store_into(&st, &staging.view(), &mut h).unwrap();
    assert_eq!(h.to_vec().unwrap(), vec![5.0, 6.0, 7.0, 8.0]);

    h.write_at(1, &[0.0, 0.5]).unwrap();
    assert_eq!(h.to_vec().unwrap(), vec![5.0, 0.0, 0.5, 8.0]);
    let e = h.write_at(3, &[1.0, 1.0]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "HostTensor::write_at: invalid argument: 2 values at offset 3 of a host tensor of 4"
    );

    let one = pool.stats().allocated;
    let c = h.try_clone().unwrap();
    assert_eq!(
        pool.stats().allocated,
        2 * one,
        "a clone is in the pool too"
    );
    h.write_at(0, &[9.0]).unwrap();
    assert_eq!(
        c.to_vec().unwrap(),
        vec![5.0, 0.0, 0.5, 8.0],
        "a clone is a copy"
    );

    let kept = {
        let mut b = DeviceBuffer::<f32>::alloc_in(&dev, 2).unwrap();
        b.memcpy_htod(&st, &[1.5, 2.5]).unwrap();
        pool.keep(&st, b, &[2]).unwrap()
    };
    assert!(!kept.on_device(), "keep settles");
    assert_eq!(kept.to_vec().unwrap(), vec![1.5, 2.5]);
}

/// A meta pool counts host tensors as real ones and moves nothing; they read back as zeros.
#[test]
fn a_meta_pool_counts_and_moves_nothing() {
    let st = Stream::new(Device::Meta).unwrap();
    let dev = CachingAllocator::new_meta();
    let pool = HostPool::new(Device::Meta).unwrap();
    let b = DeviceBuffer::<f32>::alloc_in(&dev, 1 << 20).unwrap();
    let mut h = pool.offload(&st, b, &[1 << 20]).unwrap();
    h.settle().unwrap();
    assert!(pool.stats().allocated >= 4 << 20);
    assert_eq!(dev.stats().allocated, 0);
    assert_eq!(h.to_vec().unwrap(), vec![0.0; 1 << 20]);
    let back = pool.reload(&dev, &st, &h).unwrap();
    assert_eq!(back.device(), Device::Meta);
}

/// A vacant host tensor holds nothing to read.
#[test]
fn a_vacant_host_tensor_has_no_values() {
    let h = HostTensor::<f32>::vacant();
    assert_eq!(
        (h.shape(), h.numel(), h.on_device()),
        (&[0usize][..], 0, false)
    );
    let e = h.to_vec().unwrap_err();
    assert!(e.to_string().contains("neither a pool block"), "{e}");
}

/// Without the `npu` feature a pool for an NPU cannot be made, and says why.
#[cfg(not(feature = "npu"))]
#[test]
fn an_npu_pool_needs_the_feature() {
    let e = HostPool::new(Device::Npu(0)).unwrap_err();
    assert!(matches!(e, Error::NotCompiled { .. }), "{e}");
}
