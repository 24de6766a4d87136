//! AdamW's NPU entry point (the body lands with the NPU issue; until then it returns
//! [`npu_pending`]: `NotCompiled` without `--features npu`, `Unsupported` with it).

use super::AdamW;
use crate::backend::npu_pending;
use crate::error::Result;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// `aclnnApplyAdamWV2(varRef = params, mRef = m, vRef = v, maxGradNormOptionalRef = null,
/// grad = grads, step, lr, beta1, beta2, weightDecay, eps, amsgrad = false, maximize = false)`,
/// in place. `step` is a 1-element **device** tensor holding `step - 1` (the op adds 1, as
/// torch_npu passes it); the hyper-parameters are f32 there, where the CPU kernel forms the
/// bias corrections in f64 as torch does, so the NPU issue states a tolerance against it.
/// The body validates `step` and `hp` like the slice-level call before issuing anything.
#[allow(clippy::too_many_arguments)]
pub fn step(
    ordinal: u32,
    _stream: &Stream,
    _params: &mut BufferViewMut<'_, f32>,
    _grads: &BufferView<'_, f32>,
    _m: &mut BufferViewMut<'_, f32>,
    _v: &mut BufferViewMut<'_, f32>,
    _step: u64,
    _hp: &AdamW,
) -> Result<()> {
    Err(npu_pending("adamw_step", ordinal, "aclnnApplyAdamWV2"))
}
