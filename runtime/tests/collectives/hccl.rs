//! The HCCL communicator in one process: a world of one on NPU 0 (bootstrap through the file
//! rendezvous, an all_reduce, a split, destroy), against the CANN `select_for_tests` picks (the
//! emulator, or the installed CANN on an Ascend host). Worlds of several processes are in
//! tests/hccl_procs.rs.

use std::time::Duration;

use cannon_runtime::comm::rendezvous::FileRendezvous;
use cannon_runtime::comm::{CommError, Communicator, ReduceOp};
use cannon_runtime::{Device, DeviceBuffer, Stream};

#[test]
fn world_of_one() {
    cannon_sys::emulator::select_for_tests().unwrap_or_else(|e| panic!("{e}"));
    let dir = std::env::temp_dir().join(format!("cannon-hccl-test-{}", std::process::id()));
    let rdzv = FileRendezvous::new(&dir, "hccl-one").unwrap();
    let comm = Communicator::hccl_init(0, 1, 0, rdzv.clone(), Duration::from_secs(30)).unwrap();
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
