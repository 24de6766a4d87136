//! The HCCL communicator where it can run: with CANN, a world of one on NPU 0 (bootstrap
//! through the file rendezvous, an all_reduce, a split, destroy); without CANN, the same calls
//! must be typed errors, not panics.

use std::time::Duration;

use cannon_runtime::comm::rendezvous::FileRendezvous;
use cannon_runtime::comm::{CommError, Communicator, ReduceOp};
use cannon_runtime::{Device, DeviceBuffer, Stream};

#[test]
fn world_of_one_or_a_typed_error() {
    let dir = std::env::temp_dir().join(format!("cannon-hccl-test-{}", std::process::id()));
    let rdzv = FileRendezvous::new(&dir, "hccl-one").unwrap();
    let comm = Communicator::hccl_init(0, 1, 0, rdzv.clone(), Duration::from_secs(30));
    if !cannon_sys::is_available() {
        let e = comm.unwrap_err();
        eprintln!("no CANN here: {e}");
        assert!(
            matches!(e, CommError::Runtime { .. } | CommError::Sys(_)),
            "{e}"
        );
        assert!(!rdzv.path().exists());
        return;
    }
    let comm = comm.unwrap();
    assert_eq!(
        (comm.rank(), comm.world_size(), comm.device()),
        (0, 1, Device::Npu(0))
    );
    assert!(
        !rdzv.path().exists(),
        "rank 0 removes the root info once the group is up"
    );
    let stream = Stream::new(Device::Npu(0)).unwrap();
    let x = [1.5f32, -2.0, 3.25];
    let send = DeviceBuffer::clone_htod(&stream, &x).unwrap();
    let mut recv = DeviceBuffer::<f32>::alloc(&stream, 3).unwrap();
    comm.all_reduce(&send.view(), &mut recv.view_mut(), ReduceOp::Sum, &stream)
        .unwrap();
    assert_eq!(
        recv.clone_dtoh(&stream).unwrap(),
        x,
        "a sum over one rank is the input"
    );
    let avg = comm.all_reduce(&send.view(), &mut recv.view_mut(), ReduceOp::Avg, &stream);
    assert!(matches!(avg, Err(CommError::UnsupportedReduce { .. })));
    // A host buffer handed to the NPU communicator: a typed device mismatch.
    let host = DeviceBuffer::clone_htod(&Stream::cpu(), &x).unwrap();
    let e = comm
        .all_reduce(&host.view(), &mut recv.view_mut(), ReduceOp::Sum, &stream)
        .unwrap_err();
    assert!(
        matches!(
            e,
            CommError::DeviceMismatch {
                found: Device::Cpu,
                ..
            }
        ),
        "{e}"
    );
    let sub = comm.split(7, 0, &stream).unwrap();
    assert_eq!((sub.rank(), sub.world_size()), (0, 1));
    sub.destroy().unwrap();
    comm.check_async_error().unwrap();
    comm.destroy().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
