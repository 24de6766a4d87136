//! RMSNorm's NPU bodies: aclnnRmsNorm and aclnnRmsNormGrad (aclnn_rms_norm{,_grad}.h;
//! docs/cann-api.md §4) on x viewed `[T, D]`, gamma `[D]`, rstd `[T, 1]` f32.
//!
//! The grad op writes dx and dgamma; our backward accumulates (llm.c), so the body writes
//! them to scratch buffers and adds them with aclnnInplaceAdd (a bf16 dx is then rounded
//! twice, once by the op and once by the add: within the bf16 gradient bar).
//!
//! Numerics to check on hardware: for bf16 the CPU kernel rounds the normalised row to bf16
//! before multiplying by the weight (transformers' order); aclnnRmsNorm's rounding order must
//! be compared against the same fixtures (the emulator runs the CPU kernel).
#![cfg_attr(
    not(feature = "npu"),
    allow(unused_variables, unused_imports, dead_code)
)]

use crate::backend::npu_body;
use crate::error::Result;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// `aclnnRmsNorm(x, gamma = weight, eps, yOut = out, rstdOut = rstd)`.
#[allow(clippy::too_many_arguments)]
pub fn forward<E: Float>(
    ordinal: u32,
    stream: &Stream,
    out: &mut BufferViewMut<'_, E>,
    rstd: &mut BufferViewMut<'_, f32>,
    x: &BufferView<'_, E>,
    weight: &BufferView<'_, E>,
    dim: usize,
    eps: f32,
) -> Result<()> {
    const OP: &str = "rmsnorm_forward";
    npu_body!(OP, ordinal, "aclnnRmsNorm", {
        use crate::backend::aclnn::{aclnn, AclTensor};
        let t = super::check_forward(out.len(), rstd.len(), x.len(), weight.len(), dim)?;
        if t == 0 {
            return Ok(());
        }
        let xt = AclTensor::from_view(OP, x, &[t, dim])?;
        let gt = AclTensor::from_view(OP, weight, &[dim])?;
        let yt = AclTensor::from_view_mut(OP, out, &[t, dim])?;
        let rt = AclTensor::from_view_mut(OP, rstd, &[t, 1])?;
        aclnn!(
            OP,
            stream,
            aclnnRmsNormGetWorkspaceSize,
            aclnnRmsNorm,
            (xt.raw(), gt.raw(), eps as f64, yt.raw(), rt.raw())
        )
    })
}

/// `aclnnRmsNormGrad(dy = dout, x, rstd, gamma = weight, dxOut, dgammaOut)` into scratch, then
/// `dx += dxOut`, `dweight += dgammaOut` (aclnnInplaceAdd).
#[allow(clippy::too_many_arguments)]
pub fn backward<E: Float>(
    ordinal: u32,
    stream: &Stream,
    dx: &mut BufferViewMut<'_, E>,
    dweight: &mut BufferViewMut<'_, f32>,
    dout: &BufferView<'_, E>,
    x: &BufferView<'_, E>,
    weight: &BufferView<'_, E>,
    rstd: &BufferView<'_, f32>,
    dim: usize,
) -> Result<()> {
    const OP: &str = "rmsnorm_backward";
    npu_body!(OP, ordinal, "aclnnRmsNormGrad + aclnnInplaceAdd", {
        use crate::backend::aclnn::{aclnn, AclTensor};
        use cannon_runtime::DeviceBuffer;
        let (dxl, dwl) = (dx.len(), dweight.len());
        let t =
            super::check_backward(dxl, dwl, dout.len(), x.len(), weight.len(), rstd.len(), dim)?;
        if t == 0 {
            return Ok(());
        }
        let mut sdx = DeviceBuffer::<E>::alloc(stream, x.len())?;
        let mut sdg = DeviceBuffer::<f32>::alloc(stream, dim)?;
        {
            let dyt = AclTensor::from_view(OP, dout, &[t, dim])?;
            let xt = AclTensor::from_view(OP, x, &[t, dim])?;
            let rt = AclTensor::from_view(OP, rstd, &[t, 1])?;
            let gt = AclTensor::from_view(OP, weight, &[dim])?;
            let dxt = AclTensor::from_buffer(OP, &mut sdx, &[t, dim])?;
            let dgt = AclTensor::from_buffer(OP, &mut sdg, &[dim])?;
            aclnn!(
                OP,
                stream,
                aclnnRmsNormGradGetWorkspaceSize,
                aclnnRmsNormGrad,
                (
                    dyt.raw(),
                    xt.raw(),
                    rt.raw(),
                    gt.raw(),
                    dxt.raw(),
                    dgt.raw()
                )
            )?;
        }
        crate::elementwise::npu::add_into(ordinal, stream, dx, &sdx.view())?;
        crate::elementwise::npu::add_into(ordinal, stream, dweight, &sdg.view())
    })
}
