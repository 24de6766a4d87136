//! The one backend boundary: every op on runtime buffers passes through here exactly once.
//!
//! The shape follows candle's `BackendStorage` / `Storage` split, cut down to what a kernels
//! crate needs:
//!
//! - [`Backend`] declares every op once, forward and backward, over runtime buffer views.
//!   A backend that forgets an op does not compile, so the CPU and NPU paths cannot drift
//!   apart silently. Its methods, their NPU implementation and the public entry points of
//!   [`crate::ops`] are expanded from one list (`op_list.rs`), so an op's signature is
//!   written there, in its CPU method and in its NPU body, nowhere else.
//! - [`Cpu`] implements it by borrowing the buffers' host slices and calling the op's
//!   slice-level kernel (the very code each op's tests check against float64); [`Npu`] by
//!   calling the op's aclnn body in the op's own `npu.rs`. Neither holds code of an op: the
//!   bodies stay in the op's folder.
//! - [`select`] is the only place that decides where a call runs: every operand must live on
//!   the stream's device (an operand elsewhere is an error, never a silent copy) and the
//!   stream's device picks the backend. [`crate::ops`] holds the public entry points; each is
//!   one `dispatch!` of its [`Backend`] method (its operands listed in the op list).
//!
//! Why a trait over an enum of buffers (candle's `Storage`): our buffers are already typed
//! and device-tagged by the runtime, so what varies per backend is only the body of an op.
//! Why not a trait object: the methods are generic over the element types (f32 / bf16), as
//! the kernels are, so the dispatch is a two-arm `match` that the compiler monomorphises.
//!
//! Index-like inputs that the kernels validate before use (token ids, labels, RoPE positions,
//! cu_seqlens) and the RoPE table are host slices: the host checks them (an id past the
//! vocabulary must be a typed error, not an aicore fault) and the NPU bodies upload them.

#[cfg(feature = "npu")]
pub mod aclnn;
mod cpu;
mod meta;
mod npu;
mod op_list;

use op_list::declare_backend;
pub(crate) use op_list::{define_entry_points, for_each_op};

use crate::adamw::AdamW;
use crate::attention::{BlockAttention, QkvBuf, QkvGradBuf, VarlenAttention};
use crate::cross_entropy::{CeStats, LmHeadGrads, LossNorm};
use crate::error::{KernelError, Result};
use crate::gemm::{Dims, Precision, Trans};
use crate::index::TransposeDims;
use crate::linear::{LinearDims, LinearGradBufs};
use crate::patch_embed::{PatchEmbedGradBufs, PatchGeom};
use crate::rope::RopeTable;
use cannon_runtime::{BufferView, BufferViewMut, Device, Stream};
use cannon_runtime::{Element, Float};

/// The slice-level CPU kernels on host memory.
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
    Ok(match stream {
        Device::Cpu => Selected::Cpu(Cpu),
        Device::Npu(ordinal) => Selected::Npu(Npu { ordinal }),
        Device::Meta => Selected::Meta(Meta),
    })
}

/// Runs `$call` on the backend [`select`] picks for `$op` on `$stream` given the operands.
macro_rules! dispatch {
    ($op:expr, $stream:expr, [$($arg:expr),* $(,)?], |$be:ident| $call:expr) => {{
        let selected = $crate::backend::select(
            $op,
            $stream,
            &[$(&$arg as &dyn $crate::backend::OnDevice),*],
        )?;
        match selected {
            $crate::backend::Selected::Cpu($be) => $call,
            $crate::backend::Selected::Npu($be) => $call,
            $crate::backend::Selected::Meta($be) => $call,
        }
    }};
}
pub(crate) use dispatch;

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

op_list::for_each_op!(declare_backend);
