use super::*;
use crate::comm::CpuWorld;

/// A buffer on another device is a typed error on the rank that passed it, and fails the
/// group so that its peers do not wait for it. (Without an NPU no such buffer can be
/// made, so the check is driven with the device it would report.)
#[test]
fn a_buffer_on_another_device_fails_the_group() {
    let group = Group::new(2);
    let a = CpuCommunicator::new(Device::Cpu, group.clone(), 0, Duration::from_secs(20));
    let b = CpuCommunicator::new(Device::Cpu, group, 1, Duration::from_secs(20));
    let stream = Stream::cpu();
    let e = a
        .on_host("all_reduce", true, &stream, &[("recv", Device::Npu(1))])
        .unwrap_err();
    assert_eq!(
        e,
        CommError::DeviceMismatch {
            op: "all_reduce",
            rank: 0,
            what: "recv",
            expected: Device::Cpu,
            found: Device::Npu(1),
        }
    );
    assert_eq!(
        e.to_string(),
        "all_reduce: rank 0: recv is on npu:1, the communicator is on cpu"
    );
    let t = std::time::Instant::now();
    // The peer's call is the same round, so it fails with the cause itself; the next one
    // finds the group poisoned.
    let same_round = b.barrier(&stream).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(same_round, e);
    let after = b.barrier(&stream).unwrap_err();
    assert!(
        matches!(&after, CommError::Poisoned { cause, .. } if cause.contains("npu:1")),
        "{after}"
    );
}

/// Meta ranks run the rounds of CPU ranks: calls are checked against the buffers and
/// across ranks, splits form the same groups, and no data moves (a wrong length is still
/// an error on every rank).
#[test]
fn meta_ranks_check_every_call_and_move_nothing() {
    use crate::DeviceBuffer;
    let comms = CpuWorld::meta(4, Duration::from_secs(20)).unwrap();
    let results: Vec<CommResult<(usize, usize)>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    let st = Stream::new(Device::Meta).unwrap();
                    assert_eq!(c.device(), Device::Meta);
                    let x = DeviceBuffer::<f32>::alloc(&st, 3).unwrap();
                    let mut all = DeviceBuffer::<f32>::alloc(&st, 12).unwrap();
                    c.all_gather(&x.view(), &mut all.view_mut(), &st)?;
                    let mut part = DeviceBuffer::<f32>::alloc(&st, 3).unwrap();
                    c.reduce_scatter(&all.view(), &mut part.view_mut(), ReduceOp::Sum, &st)?;
                    c.send_recv(
                        &x.view(),
                        (c.rank() + 1) % 4,
                        &mut part.view_mut(),
                        (c.rank() + 3) % 4,
                        &st,
                    )?;
                    let sub = c.split((c.rank() % 2) as u32, 0, &st)?;
                    let got = (sub.rank(), sub.world_size());
                    assert_eq!(got, (c.rank() / 2, 2), "rank {}'s split", c.rank());
                    // Rank 3 gathers into a buffer one element short.
                    let short = if c.rank() == 3 { 11 } else { 12 };
                    let mut bad = DeviceBuffer::<f32>::alloc(&st, short).unwrap();
                    match c.all_gather(&x.view(), &mut bad.view_mut(), &st) {
                        Ok(()) => Ok(got),
                        Err(e) => Err(e),
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, r) in results.iter().enumerate() {
        let e = r.as_ref().unwrap_err();
        assert!(e.to_string().contains("11 elements"), "rank {rank}: {e}");
    }
    let cpu = Stream::cpu();
    let c = CpuWorld::meta(1, Duration::from_secs(5)).unwrap().remove(0);
    let host = DeviceBuffer::<f32>::alloc(&cpu, 1).unwrap();
    let mut out = DeviceBuffer::<f32>::alloc(&cpu, 1).unwrap();
    let e = c
        .all_gather(&host.view(), &mut out.view_mut(), &cpu)
        .unwrap_err();
    assert!(matches!(e, CommError::DeviceMismatch { .. }), "{e}");
}
