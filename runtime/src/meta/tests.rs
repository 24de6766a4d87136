use crate::{CachingAllocator, Device, DeviceBuffer, Stream};

/// A meta allocator counts and caches like a host one, request for request, and its
/// buffers have sizes and no storage.
#[test]
fn meta_blocks_are_counted_as_host_blocks_are() {
    let (meta, host) = (CachingAllocator::new_meta(), CachingAllocator::new_cpu());
    let (ms, hs) = (Stream::new(Device::Meta).unwrap(), Stream::cpu());
    for (alloc, st) in [(&meta, &ms), (&host, &hs)] {
        let a = DeviceBuffer::<f32>::alloc_on(alloc, st, 1000).unwrap();
        let b = DeviceBuffer::<u8>::alloc_on(alloc, st, 77).unwrap();
        drop(a);
        let _c = DeviceBuffer::<f32>::alloc_on(alloc, st, 990).unwrap();
        drop(b);
    }
    let (m, h) = (meta.stats(), host.stats());
    assert_eq!(m, h);
    assert_eq!(m.peak_allocated, 4096 + 512);
    assert_eq!(
        m.num_device_allocs, 2,
        "the 990-float request reused the freed block"
    );

    let mut x = DeviceBuffer::<f32>::alloc_on(&meta, &ms, 4).unwrap();
    assert_eq!((x.len(), x.device()), (4, Device::Meta));
    assert!(x.as_host_slice().is_err());
    assert!(x.as_host_slice_mut().is_err());
    x.memcpy_htod(&ms, &[1.0, 2.0, 3.0, 4.0]).unwrap();
    assert_eq!(
        x.clone_dtoh(&ms).unwrap(),
        vec![0.0; 4],
        "no storage: zeros back"
    );
    assert!(
        x.memcpy_htod(&ms, &[1.0]).is_err(),
        "lengths are still checked"
    );
    assert!(x.memcpy_htod(&hs, &[0.0; 4]).is_err(), "so are devices");
}
