//! Where an op on runtime buffers runs, and the aclnn helpers its NPU bodies share.
//!
//! This module holds no op. Each op's device-level entry points live in its own folder
//! (`<op>/device.rs`, gathered by [`crate::ops`]), shaped like candle's `CustomOp`
//! `cpu_fwd` / `cuda_fwd`: the op's check, then [`select`] once, then one exhaustive `match`
//! over [`Selected`] whose arms are the op's CPU glue, its NPU body (`<op>/npu.rs`) and its
//! meta value. A backend added to [`Selected`] fails to compile until every op has an arm
//! for it, so no backend forgets an op.
//!
//! - [`select`] is the only place that decides where a call runs: every operand must live on
//!   the stream's device (an operand elsewhere is an error, never a silent copy) and the
//!   stream's device picks the backend ([`Selected::from`] a device, which a device-dependent
//!   layout such as attention's saved statistics follows too).
//! - [`OnDevice`] is what `select` asks of an operand: the devices of its buffers.
//! - [`npu_pending`] / `npu_body!` give an NPU body the typed error of a build without
//!   `--features npu`; `aclnn` (with that feature) wraps the aclnn calls the bodies make.
//!
//! Why an enum and not a trait with one method per op: our buffers are already typed and
//! device-tagged by the runtime, so what varies per backend is only the body of an op, and
//! an op's bodies read best side by side in its folder. The ops are generic over the element
//! types (f32 / bf16), as the kernels are, so the `match` is monomorphised per call.
//!
//! Index-like inputs that the kernels validate before use (token ids, labels, RoPE positions,
//! cu_seqlens) and the RoPE table are host slices: the host checks them (an id past the
//! vocabulary must be a typed error, not an aicore fault) and the NPU bodies upload them.

#[cfg(feature = "npu")]
pub mod aclnn;

use crate::error::{KernelError, Result};
use cannon_runtime::{BufferView, BufferViewMut, Device, Stream};

/// The slice-level CPU kernels on host memory (each op's `device::on_cpu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cpu;

/// The aclnn path on the NPU with this ordinal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Npu {
    pub ordinal: u32,
}

/// The meta device: operands checked (devices here; lengths, dims, ids and precision by the
/// op's `check`, the rules the CPU and NPU paths enforce; ranges by the views' own bounds),
/// nothing computed ([`cannon_runtime::Device::Meta`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta;

/// The backend [`select`] chose for one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Selected {
    Cpu(Cpu),
    Npu(Npu),
    Meta(Meta),
}

/// The backend of a device, whatever the operands: what an op's device-dependent layout
/// (attention's saved statistics) follows, and what [`select_on`] picks once the operands
/// are checked.
impl From<Device> for Selected {
    fn from(device: Device) -> Self {
        match device {
            Device::Cpu => Selected::Cpu(Cpu),
            Device::Npu(ordinal) => Selected::Npu(Npu { ordinal }),
            Device::Meta => Selected::Meta(Meta),
        }
    }
}

/// Something whose memory lives on devices: a buffer view, an optional one, a group of
/// gradient views. [`select`] checks each against the stream's device.
pub trait OnDevice {
    /// Pushes the device of every present buffer.
    fn devices(&self, out: &mut Vec<Device>);
}

impl<T: cannon_runtime::Element> OnDevice for BufferView<'_, T> {
    fn devices(&self, out: &mut Vec<Device>) {
        out.push(self.device());
    }
}

impl<T: cannon_runtime::Element> OnDevice for BufferViewMut<'_, T> {
    fn devices(&self, out: &mut Vec<Device>) {
        out.push(self.device());
    }
}

impl<X: OnDevice> OnDevice for Option<X> {
    fn devices(&self, out: &mut Vec<Device>) {
        if let Some(x) = self {
            x.devices(out);
        }
    }
}

impl<X: OnDevice + ?Sized> OnDevice for &X {
    fn devices(&self, out: &mut Vec<Device>) {
        (**self).devices(out);
    }
}

impl<X: OnDevice + ?Sized> OnDevice for &mut X {
    fn devices(&self, out: &mut Vec<Device>) {
        (**self).devices(out);
    }
}

impl<X: OnDevice> OnDevice for [X] {
    fn devices(&self, out: &mut Vec<Device>) {
        for x in self {
            x.devices(out);
        }
    }
}

/// The backend for `op` issued on `stream`, given its operands.
///
/// Every operand must live on the stream's device; the first that does not is a
/// [`cannon_runtime::Error::DeviceMismatch`] naming the op, the stream's device (expected)
/// and the operand's (found).
pub fn select(op: &'static str, stream: &Stream, operands: &[&dyn OnDevice]) -> Result<Selected> {
    let mut devices = Vec::new();
    for o in operands {
        o.devices(&mut devices);
    }
    select_on(op, stream.device(), &devices)
}

/// [`select`] given the stream's device and the operands' devices (an NPU stream cannot be
/// created without CANN, but the rule can still be checked).
pub fn select_on(op: &'static str, stream: Device, operands: &[Device]) -> Result<Selected> {
    if let Some(&found) = operands.iter().find(|&&d| d != stream) {
        return Err(KernelError::Runtime(
            cannon_runtime::Error::DeviceMismatch {
                what: op,
                expected: stream,
                found,
            },
        ));
    }
    Ok(Selected::from(stream))
}

/// The error of an NPU body that cannot run: [`KernelError::NotCompiled`] when the crate
/// is built without `npu` (no NPU path exists in this build), otherwise
/// [`KernelError::Unsupported`] naming the aclnn op (or composition) the body needs and
/// that the bindings lack.
pub fn npu_pending(op: &'static str, ordinal: u32, aclnn: &'static str) -> KernelError {
    let device = Device::Npu(ordinal).to_string();
    if cfg!(feature = "npu") {
        KernelError::Unsupported {
            op,
            device,
            reason: format!("{aclnn} is not in the aclnn bindings yet (sys/README.md)"),
        }
    } else {
        KernelError::NotCompiled { op, device }
    }
}

/// An op's NPU body: `$body` with `--features npu`, the typed [`npu_pending`] error
/// (`NotCompiled`) without it. `$aclnn` names the aclnn call(s) for that error.
macro_rules! npu_body {
    ($op:expr, $ordinal:expr, $aclnn:expr, $body:block) => {{
        #[cfg(feature = "npu")]
        {
            let _ = ($ordinal, $aclnn);
            $body
        }
        #[cfg(not(feature = "npu"))]
        {
            Err($crate::backend::npu_pending($op, $ordinal, $aclnn))
        }
    }};
}
pub(crate) use npu_body;
