//! The meta device through the one dispatch point: every operand on meta is accepted and
//! nothing is computed (outputs keep no values, a loss reports the labels it counted); an
//! operand on another device is the usual `DeviceMismatch`.

use cannon_kernels::cross_entropy::{LossNorm, IGNORE_INDEX};
use cannon_kernels::{ops, KernelError};
use cannon_runtime::{Device, DeviceBuffer, Stream};

#[test]
fn meta_operands_are_checked_and_nothing_is_computed() {
    let st = Stream::new(Device::Meta).unwrap();
    let mut y = DeviceBuffer::<f32>::alloc(&st, 6).unwrap();
    let x = DeviceBuffer::<f32>::alloc(&st, 6).unwrap();
    ops::add_into(&st, &mut y.view_mut(), &x.view()).unwrap();
    assert_eq!(
        y.clone_dtoh(&st).unwrap(),
        vec![0.0; 6],
        "no storage, no values"
    );

    let logits = DeviceBuffer::<f32>::alloc(&st, 3 * 4).unwrap();
    let labels = [1, IGNORE_INDEX, 3];
    let ce = ops::cross_entropy(&st, &logits.view(), &labels, 4, None, LossNorm::Mean).unwrap();
    assert_eq!((ce.count, ce.loss), (2, 0.0));

    let cpu = Stream::cpu();
    let on_cpu = DeviceBuffer::<f32>::clone_htod(&cpu, &[0.0; 6]).unwrap();
    let e = ops::add_into(&st, &mut y.view_mut(), &on_cpu.view()).unwrap_err();
    assert!(
        matches!(
            &e,
            KernelError::Runtime(cannon_runtime::Error::DeviceMismatch {
                found: Device::Cpu,
                ..
            })
        ),
        "{e}"
    );
}
