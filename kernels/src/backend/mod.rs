//! The one backend boundary: every op on runtime buffers passes through here exactly once.
//!
//! The shape follows candle's `BackendStorage` / `Storage` split, cut down to what a kernels
//! crate needs:
//!
//! - [`Backend`] declares every op once, forward and backward, over runtime buffer views.
//!   A backend that forgets an op does not compile, so the CPU and NPU paths cannot drift
//!   apart silently.
//! - [`Cpu`] implements it by borrowing the buffers' host slices and calling the op's
//!   slice-level kernel (the very code each op's tests check against float64); [`Npu`] by
//!   calling the op's aclnn body in the op's own `npu.rs`. Neither holds code of an op: the
//!   bodies stay in the op's folder.
//! - [`select`] is the only place that decides where a call runs: every operand must live on
//!   the stream's device (an operand elsewhere is an error, never a silent copy) and the
//!   stream's device picks the backend. [`crate::ops`] holds the public entry points; each is
//!   one `dispatch!` of its [`Backend`] method.
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
mod npu;

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

/// The backend [`select`] chose for one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Selected {
    Cpu(Cpu),
    Npu(Npu),
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

/// Every op of the crate over runtime buffers, as one backend runs it. Shapes, conventions
/// and errors are those of the slice-level op (see each op's module); `stream` orders the
/// work on the backend's device.
#[allow(clippy::too_many_arguments)]
pub trait Backend {
    /// One AdamW step of `params`, `m`, `v` in place ([`crate::adamw`]).
    fn adamw_step(
        &self,
        stream: &Stream,
        params: &mut BufferViewMut<'_, f32>,
        grads: &BufferView<'_, f32>,
        m: &mut BufferViewMut<'_, f32>,
        v: &mut BufferViewMut<'_, f32>,
        step: u64,
        hp: &AdamW,
    ) -> Result<()>;

    /// Varlen attention forward: writes `out` and `lse` ([`crate::attention`]).
    fn attention_forward<E: Float>(
        &self,
        stream: &Stream,
        a: &VarlenAttention,
        x: QkvBuf<'_, E>,
        out: &mut BufferViewMut<'_, E>,
        lse: &mut BufferViewMut<'_, f32>,
    ) -> Result<()>;

    /// Varlen attention backward: overwrites dq, dk, dv.
    fn attention_backward<E: Float>(
        &self,
        stream: &Stream,
        a: &VarlenAttention,
        x: QkvBuf<'_, E>,
        out: &BufferView<'_, E>,
        lse: &BufferView<'_, f32>,
        dout: &BufferView<'_, E>,
        g: QkvGradBuf<'_, '_, E>,
    ) -> Result<()>;

    /// Ring attention block forward: merges into the f32 `out` and `lse` accumulators.
    fn attention_block_forward<E: Float>(
        &self,
        stream: &Stream,
        a: &BlockAttention,
        x: QkvBuf<'_, E>,
        out: &mut BufferViewMut<'_, f32>,
        lse: &mut BufferViewMut<'_, f32>,
    ) -> Result<()>;

    /// Ring attention block backward: adds into the f32 dq, dk, dv accumulators.
    #[allow(clippy::too_many_arguments)]
    fn attention_block_backward<E: Float>(
        &self,
        stream: &Stream,
        a: &BlockAttention,
        x: QkvBuf<'_, E>,
        out: &BufferView<'_, E>,
        lse: &BufferView<'_, f32>,
        dout: &BufferView<'_, E>,
        g: QkvGradBuf<'_, '_, f32>,
    ) -> Result<()>;

    /// `dst = src` converted between storage types ([`crate::cast`]).
    fn cast<A: Float, B: Float>(
        &self,
        stream: &Stream,
        src: &BufferView<'_, A>,
        dst: &mut BufferViewMut<'_, B>,
    ) -> Result<()>;

    /// Cross-entropy of `[N, V]` logits; writes `d_logits` when given.
    fn cross_entropy(
        &self,
        stream: &Stream,
        logits: &BufferView<'_, f32>,
        labels: &[i32],
        vocab: usize,
        d_logits: Option<&mut BufferViewMut<'_, f32>>,
        norm: LossNorm,
    ) -> Result<CeStats>;

    /// Cross-entropy whose gradient overwrites the logits.
    fn cross_entropy_in_place(
        &self,
        stream: &Stream,
        logits: &mut BufferViewMut<'_, f32>,
        labels: &[i32],
        vocab: usize,
        norm: LossNorm,
    ) -> Result<CeStats>;

    /// Cross-entropy of the lm_head logits `h w^T`, `chunk_rows` rows at a time.
    fn cross_entropy_lm_head(
        &self,
        stream: &Stream,
        h: &BufferView<'_, f32>,
        w: &BufferView<'_, f32>,
        labels: &[i32],
        d_model: usize,
        vocab: usize,
        chunk_rows: usize,
        norm: LossNorm,
        grads: LmHeadGrads<'_>,
    ) -> Result<CeStats>;

    /// Gathers rows `ids` of `weight` ([`crate::embedding`]).
    fn embedding_forward<E: Float>(
        &self,
        stream: &Stream,
        out: &mut BufferViewMut<'_, E>,
        ids: &[u32],
        weight: &BufferView<'_, E>,
        dim: usize,
    ) -> Result<()>;

    /// `dweight[ids[t]] += dout[t]`.
    fn embedding_backward<E: Float>(
        &self,
        stream: &Stream,
        dweight: &mut BufferViewMut<'_, f32>,
        dout: &BufferView<'_, E>,
        ids: &[u32],
        dim: usize,
    ) -> Result<()>;

    /// `y = gelu(x)` ([`crate::gelu`]).
    fn gelu_forward<E: Float>(
        &self,
        stream: &Stream,
        y: &mut BufferViewMut<'_, E>,
        x: &BufferView<'_, E>,
    ) -> Result<()>;

    /// `dx += dy * gelu'(x)`.
    fn gelu_backward<E: Float>(
        &self,
        stream: &Stream,
        dx: &mut BufferViewMut<'_, E>,
        dy: &BufferView<'_, E>,
        x: &BufferView<'_, E>,
    ) -> Result<()>;

    /// `C = alpha op(A) op(B) + beta C` in precision `p` ([`crate::gemm`]).
    fn gemm<A: Float, B: Float>(
        &self,
        stream: &Stream,
        p: Precision,
        ta: Trans,
        tb: Trans,
        d: Dims,
        alpha: f32,
        a: &BufferView<'_, A>,
        lda: usize,
        b: &BufferView<'_, B>,
        ldb: usize,
        beta: f32,
        c: &mut BufferViewMut<'_, f32>,
        ldc: usize,
    ) -> Result<()>;

    /// Sum of squares of every element of every view, in f64 ([`crate::grad_clip`]).
    fn grad_sum_squares(&self, stream: &Stream, grads: &[BufferView<'_, f32>]) -> Result<f64>;

    /// Every element of every view times `coef`.
    fn scale_grads(
        &self,
        stream: &Stream,
        grads: &mut [BufferViewMut<'_, f32>],
        coef: f32,
    ) -> Result<()>;

    /// `y = x w^T (+ b)` in precision `p` ([`crate::linear`]).
    fn linear_forward<Y: Float, X: Float, W: Float>(
        &self,
        stream: &Stream,
        p: Precision,
        y: &mut BufferViewMut<'_, Y>,
        x: &BufferView<'_, X>,
        w: &BufferView<'_, W>,
        b: Option<&BufferView<'_, W>>,
        d: LinearDims,
    ) -> Result<()>;

    /// Accumulates the gradients present in `g`, in precision `p`.
    fn linear_backward<G: Float, X: Float, W: Float>(
        &self,
        stream: &Stream,
        p: Precision,
        g: LinearGradBufs<'_>,
        dy: &BufferView<'_, G>,
        x: &BufferView<'_, X>,
        w: &BufferView<'_, W>,
        d: LinearDims,
    ) -> Result<()>;

    /// `out = im2col(pixels) weight^T` in precision `p` ([`crate::patch_embed`]).
    fn patch_embed_forward<P: Float, W: Float>(
        &self,
        stream: &Stream,
        p: Precision,
        out: &mut BufferViewMut<'_, f32>,
        pixels: &BufferView<'_, P>,
        weight: &BufferView<'_, W>,
        g: PatchGeom,
        d_model: usize,
    ) -> Result<()>;

    /// Accumulates the gradients present in `grads`, in precision `p`.
    fn patch_embed_backward<G: Float, P: Float, W: Float>(
        &self,
        stream: &Stream,
        p: Precision,
        grads: PatchEmbedGradBufs<'_>,
        dout: &BufferView<'_, G>,
        pixels: &BufferView<'_, P>,
        weight: &BufferView<'_, W>,
        g: PatchGeom,
        d_model: usize,
    ) -> Result<()>;

    /// `out = rmsnorm(x) * weight`, saving `rstd` ([`crate::rmsnorm`]).
    fn rmsnorm_forward<E: Float>(
        &self,
        stream: &Stream,
        out: &mut BufferViewMut<'_, E>,
        rstd: &mut BufferViewMut<'_, f32>,
        x: &BufferView<'_, E>,
        weight: &BufferView<'_, E>,
        dim: usize,
        eps: f32,
    ) -> Result<()>;

    /// Accumulates `dx` and `dweight`.
    fn rmsnorm_backward<E: Float>(
        &self,
        stream: &Stream,
        dx: &mut BufferViewMut<'_, E>,
        dweight: &mut BufferViewMut<'_, f32>,
        dout: &BufferView<'_, E>,
        x: &BufferView<'_, E>,
        weight: &BufferView<'_, E>,
        rstd: &BufferView<'_, f32>,
        dim: usize,
    ) -> Result<()>;

    /// Rotates `x` in place by the angles of `pos` ([`crate::rope`]).
    fn rope_forward<E: Float>(
        &self,
        stream: &Stream,
        x: &mut BufferViewMut<'_, E>,
        n_heads: usize,
        table: &RopeTable,
        pos: &[u32],
    ) -> Result<()>;

    /// The inverse rotation of `dx`, in place.
    fn rope_backward<E: Float>(
        &self,
        stream: &Stream,
        dx: &mut BufferViewMut<'_, E>,
        n_heads: usize,
        table: &RopeTable,
        pos: &[u32],
    ) -> Result<()>;

    /// `h = silu(gate) * up` ([`crate::swiglu`]).
    fn swiglu_forward<E: Float>(
        &self,
        stream: &Stream,
        h: &mut BufferViewMut<'_, E>,
        gate: &BufferView<'_, E>,
        up: &BufferView<'_, E>,
    ) -> Result<()>;

    /// Accumulates `d_gate` and `d_up`.
    fn swiglu_backward<E: Float>(
        &self,
        stream: &Stream,
        d_gate: &mut BufferViewMut<'_, E>,
        d_up: &mut BufferViewMut<'_, E>,
        dh: &BufferView<'_, E>,
        gate: &BufferView<'_, E>,
        up: &BufferView<'_, E>,
    ) -> Result<()>;

    /// `y += x` ([`crate::elementwise`]).
    fn add_into<E: Float>(
        &self,
        stream: &Stream,
        y: &mut BufferViewMut<'_, E>,
        x: &BufferView<'_, E>,
    ) -> Result<()>;

    /// `out = a * b`.
    fn mul<E: Float>(
        &self,
        stream: &Stream,
        out: &mut BufferViewMut<'_, E>,
        a: &BufferView<'_, E>,
        b: &BufferView<'_, E>,
    ) -> Result<()>;

    /// `y *= x`.
    fn mul_into<E: Float>(
        &self,
        stream: &Stream,
        y: &mut BufferViewMut<'_, E>,
        x: &BufferView<'_, E>,
    ) -> Result<()>;

    /// `out[i] = src[idx[i]]`, rows of `dim` ([`crate::index`]).
    fn gather_rows<T: Element>(
        &self,
        stream: &Stream,
        out: &mut BufferViewMut<'_, T>,
        src: &BufferView<'_, T>,
        idx: &[usize],
        dim: usize,
    ) -> Result<()>;

    /// `dst[idx[i]] = src[i]`.
    fn scatter_rows<T: Element>(
        &self,
        stream: &Stream,
        dst: &mut BufferViewMut<'_, T>,
        src: &BufferView<'_, T>,
        idx: &[usize],
        dim: usize,
    ) -> Result<()>;

    /// `dst[idx[i]] += src[i]`, in order of i.
    fn scatter_add_rows<E: Float>(
        &self,
        stream: &Stream,
        dst: &mut BufferViewMut<'_, E>,
        src: &BufferView<'_, E>,
        idx: &[usize],
        dim: usize,
    ) -> Result<()>;

    /// `dst[idx[i]] = 0`.
    fn zero_rows<T: Element>(
        &self,
        stream: &Stream,
        dst: &mut BufferViewMut<'_, T>,
        idx: &[usize],
        dim: usize,
    ) -> Result<()>;

    /// `out[b, c, r] = x[b, r, c]`.
    fn transpose<T: Element>(
        &self,
        stream: &Stream,
        out: &mut BufferViewMut<'_, T>,
        x: &BufferView<'_, T>,
        d: TransposeDims,
    ) -> Result<()>;
}
