//! The dispatch rules of the device selection every op passes (`select` / `select_on`):
//! NPU buffers cannot be allocated without CANN, so the rule is checked on device lists.

use cannon_kernels::backend::{select, select_on, Cpu, Npu, Selected};
use cannon_kernels::KernelError;
use cannon_runtime::{Device, Stream};

#[test]
fn backend_follows_the_stream_device() {
    let cpu = Stream::cpu();
    assert_eq!(select("op", &cpu, &[]).unwrap(), Selected::Cpu(Cpu));
    assert_eq!(
        select_on("op", Device::Cpu, &[Device::Cpu; 3]).unwrap(),
        Selected::Cpu(Cpu)
    );
    let npu = [Device::Npu(2); 4];
    assert_eq!(
        select_on("op", Device::Npu(2), &npu).unwrap(),
        Selected::Npu(Npu { ordinal: 2 })
    );
}

#[track_caller]
fn assert_mismatch(e: KernelError, op: &str, expected: Device, found: Device) {
    let msg = e.to_string();
    match e {
        KernelError::Runtime(cannon_runtime::Error::DeviceMismatch {
            what,
            expected: ex,
            found: fo,
        }) => {
            assert_eq!((what, ex, fo), (op, expected, found));
        }
        other => panic!("expected a device mismatch, got {other:?}"),
    }
    for part in [op.to_string(), expected.to_string(), found.to_string()] {
        assert!(msg.contains(&part), "{msg:?} does not name {part}");
    }
}

#[test]
fn mixed_devices_are_a_typed_error_naming_op_and_devices() {
    let cpu = Stream::cpu();
    let e = select_on(
        "rmsnorm_forward",
        cpu.device(),
        &[Device::Cpu, Device::Npu(0)],
    )
    .unwrap_err();
    assert_mismatch(e, "rmsnorm_forward", Device::Cpu, Device::Npu(0));

    let ops = [Device::Npu(0), Device::Cpu, Device::Npu(0)];
    let e = select_on("linear_forward", Device::Npu(0), &ops).unwrap_err();
    assert_mismatch(e, "linear_forward", Device::Npu(0), Device::Cpu);

    let e = select_on("gemm_f32", Device::Npu(0), &[Device::Npu(1)]).unwrap_err();
    assert_mismatch(e, "gemm_f32", Device::Npu(0), Device::Npu(1));
}
