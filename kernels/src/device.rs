//! Device dispatch shared by every op's `device.rs`: which backend runs a call, and the typed
//! error of an NPU entry point whose body has not landed yet.
//!
//! Each op has two layers of API:
//! - slice level (`rmsnorm::rmsnorm_forward(&mut [E], ...)`): the CPU kernels, on host memory;
//! - device level (`rmsnorm::device::forward(&Stream, &mut BufferViewMut<E>, ...)`): the same
//!   call over runtime buffers. [`backend`] checks that every operand lives on the stream's
//!   device and picks the path: on the CPU the device-level call borrows the host slices and
//!   calls the slice-level function (the very code the op's tests check); on an NPU it calls
//!   the op's `npu` entry point, which issues aclnn calls (or a documented composition of
//!   them). An operand on another device is an error, never a silent copy, and an NPU call is
//!   never served by the host.
//!
//! Index-like inputs that the kernels validate before use (token ids, labels, RoPE positions)
//! and the RoPE table are host slices at the device level: the host checks them (an id past
//! the vocabulary must be a typed error, not an aicore fault) and the NPU path uploads them.

use crate::error::{KernelError, Result};
use cannon_runtime::{Device, Stream};

/// Where one call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The slice-level CPU kernels on host memory.
    Cpu,
    /// The aclnn path on the NPU with this ordinal.
    Npu(u32),
}

/// The backend for `op` issued on `stream`, given the device of each operand.
///
/// Every operand must live on the stream's device; the first that does not is a
/// [`cannon_runtime::Error::DeviceMismatch`] naming the op, the stream's device (expected) and
/// the operand's (found).
pub fn backend(op: &'static str, stream: &Stream, operands: &[Device]) -> Result<Backend> {
    backend_on(op, stream.device(), operands)
}

/// [`backend`] given the stream's device rather than the stream (an NPU stream cannot be
/// created without CANN, but the rule can still be checked).
pub fn backend_on(op: &'static str, stream: Device, operands: &[Device]) -> Result<Backend> {
    if let Some(&found) = operands.iter().find(|&&d| d != stream) {
        return Err(KernelError::Runtime(
            cannon_runtime::Error::DeviceMismatch {
                what: op,
                expected: stream,
                found,
            },
        ));
    }
    Ok(match stream {
        Device::Cpu => Backend::Cpu,
        Device::Npu(ordinal) => Backend::Npu(ordinal),
    })
}

/// The error of an NPU entry point whose aclnn body has not landed: [`KernelError::NotCompiled`]
/// when the crate is built without `npu` (no NPU path exists in this build), otherwise
/// [`KernelError::Unsupported`] naming the aclnn op (or composition) the body will call.
pub fn npu_pending(op: &'static str, ordinal: u32, aclnn: &'static str) -> KernelError {
    let device = Device::Npu(ordinal).to_string();
    if cfg!(feature = "npu") {
        KernelError::Unsupported {
            op,
            device,
            reason: format!("{aclnn} dispatch lands with the NPU issue"),
        }
    } else {
        KernelError::NotCompiled { op, device }
    }
}

/// The devices of the operands that are present, for [`backend`] calls with optional ones.
pub(crate) fn present(required: &[Device], optional: &[Option<Device>]) -> Vec<Device> {
    let mut all = required.to_vec();
    all.extend(optional.iter().flatten());
    all
}
