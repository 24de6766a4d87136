//! AdamW's NPU body: `aclnnApplyAdamWV2` (aclnn_apply_adam_w_v2.h; docs/cann-api.md §0 item
//! 8, §4), in place on params, m and v.
//!
//! `step` is a one-element **device** int64 tensor holding `step - 1`: the op adds 1, as
//! torch_npu passes it. The hyper-parameters are f32 in the op's signature, where the CPU
//! kernel forms lr and the bias corrections in f64 as torch does. The difference is one f32
//! rounding of each hyper-parameter, which matters most through `1 - beta2`: 1 - f32(0.999)
//! is 1.3e-5 relative off 1 - 0.999, so v and the step differ by about that much (measured on
//! the emulator: rel L2 <= 2e-5), well inside the K-step parameter bar of 1e-4.
//! The body validates `step` and `hp` like the slice-level call before issuing anything.
#![cfg_attr(
    not(feature = "npu"),
    allow(unused_variables, unused_imports, dead_code)
)]

use super::AdamW;
use crate::backend::npu_body;
use crate::error::Result;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// `aclnnApplyAdamWV2(varRef = params, mRef = m, vRef = v, maxGradNormOptionalRef = null,
/// grad = grads, step = [step - 1], lr, beta1, beta2, weightDecay, eps, amsgrad = false,
/// maximize = false)`.
#[allow(clippy::too_many_arguments)]
pub fn step(
    ordinal: u32,
    stream: &Stream,
    params: &mut BufferViewMut<'_, f32>,
    grads: &BufferView<'_, f32>,
    m: &mut BufferViewMut<'_, f32>,
    v: &mut BufferViewMut<'_, f32>,
    step: u64,
    hp: &AdamW,
) -> Result<()> {
    const OP: &str = "adamw_step";
    npu_body!(OP, ordinal, "aclnnApplyAdamWV2", {
        use crate::backend::aclnn::{aclnn, AclTensor};
        use cannon_runtime::DeviceBuffer;
        let n = params.len();
        super::check_step(n, grads.len(), m.len(), v.len(), step, hp)?;
        if n == 0 {
            return Ok(());
        }
        let mut st = DeviceBuffer::<i64>::clone_htod(stream, &[step as i64 - 1])?;
        let pt = AclTensor::from_view_mut(OP, params, &[n])?;
        let mt = AclTensor::from_view_mut(OP, m, &[n])?;
        let vt = AclTensor::from_view_mut(OP, v, &[n])?;
        let gt = AclTensor::from_view(OP, grads, &[n])?;
        let stt = AclTensor::from_buffer(OP, &mut st, &[1])?;
        aclnn!(
            OP,
            stream,
            aclnnApplyAdamWV2GetWorkspaceSize,
            aclnnApplyAdamWV2,
            (
                pt.raw(),
                mt.raw(),
                vt.raw(),
                std::ptr::null_mut(),
                gt.raw(),
                stt.raw(),
                hp.lr as f32,
                hp.beta1 as f32,
                hp.beta2 as f32,
                hp.weight_decay as f32,
                hp.eps as f32,
                false,
                false
            )
        )
    })
}
