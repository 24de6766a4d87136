use super::super::Communicator;
use super::*;
use crate::DeviceBuffer;

fn buf(st: &Stream, x: &[f32]) -> DeviceBuffer<f32> {
    DeviceBuffer::clone_htod(st, x).unwrap()
}

/// Every collective of one rank hands its input back unchanged; in-place ones leave it.
#[test]
fn collectives_of_one_rank_are_the_identity() {
    let st = Stream::cpu();
    let c = Communicator::solo(Device::Cpu, Duration::from_secs(1));
    assert_eq!((c.rank(), c.world_size(), c.device()), (0, 1, Device::Cpu));
    let x = buf(&st, &[1.0, -2.0, 3.5]);
    type Op = fn(&Communicator, &DeviceBuffer<f32>, &mut DeviceBuffer<f32>, &Stream);
    let ops: [(&str, Op); 6] = [
        ("all_reduce", |c, x, y, st| {
            c.all_reduce(&x.view(), &mut y.view_mut(), ReduceOp::Sum, st)
                .unwrap()
        }),
        ("all_gather", |c, x, y, st| {
            c.all_gather(&x.view(), &mut y.view_mut(), st).unwrap()
        }),
        ("all_gather_v", |c, x, y, st| {
            c.all_gather_v(&x.view(), &mut y.view_mut(), &[3], st)
                .unwrap()
        }),
        ("reduce_scatter", |c, x, y, st| {
            c.reduce_scatter(&x.view(), &mut y.view_mut(), ReduceOp::Max, st)
                .unwrap()
        }),
        ("all_to_all", |c, x, y, st| {
            c.all_to_all(&x.view(), &mut y.view_mut(), st).unwrap()
        }),
        ("send_recv", |c, x, y, st| {
            c.send_recv(&x.view(), 0, &mut y.view_mut(), 0, st).unwrap()
        }),
    ];
    for (name, op) in ops {
        let mut y = buf(&st, &[0.0; 3]);
        op(&c, &x, &mut y, &st);
        assert_eq!(y.clone_dtoh(&st).unwrap(), vec![1.0, -2.0, 3.5], "{name}");
    }
    let mut z = buf(&st, &[4.0, 5.0]);
    c.all_reduce_in_place(&mut z.view_mut(), ReduceOp::Sum, &st)
        .unwrap();
    c.broadcast(&mut z.view_mut(), 0, &st).unwrap();
    c.barrier(&st).unwrap();
    assert_eq!(z.clone_dtoh(&st).unwrap(), vec![4.0, 5.0]);
    let s = c.split(3, 0, &st).unwrap();
    assert_eq!((s.rank(), s.world_size()), (0, 1));
    assert!(c.calls() >= 9);
}

/// What a group would reject is rejected: wrong lengths and counts, a peer that does not
/// exist, a buffer on another device, a message to oneself.
#[test]
fn bad_arguments_are_errors_naming_the_call() {
    let st = Stream::cpu();
    let c = Communicator::solo(Device::Cpu, Duration::from_secs(1));
    let x = buf(&st, &[1.0, 2.0]);
    let mut y = buf(&st, &[0.0; 3]);
    let e = c.all_gather(&x.view(), &mut y.view_mut(), &st).unwrap_err();
    assert!(
        matches!(
            e,
            CommError::InvalidArgument {
                op: "all_gather",
                ..
            }
        ),
        "{e}"
    );
    let mut y2 = buf(&st, &[0.0; 2]);
    let e = c
        .all_gather_v(&x.view(), &mut y2.view_mut(), &[1, 1], &st)
        .unwrap_err();
    assert!(e.to_string().contains("counts"), "{e}");
    let e = c.broadcast(&mut y2.view_mut(), 1, &st).unwrap_err();
    assert!(matches!(e, CommError::InvalidRank { rank: 1, .. }), "{e}");
    assert!(c.send(&x.view(), 0, &st).is_err());
    assert!(c.recv(&mut y2.view_mut(), 0, &st).is_err());
    let npu = Communicator::solo(Device::Npu(0), Duration::from_secs(1));
    let e = npu
        .all_gather(&x.view(), &mut y2.view_mut(), &st)
        .unwrap_err();
    assert!(matches!(e, CommError::DeviceMismatch { .. }), "{e}");
}
