//! AdamW over runtime buffers: the CPU path is [`adamw_step`] on the host slices, the NPU
//! path [`super::npu`]. params, grads, m, v: `[N]` f32.

use super::{adamw_step, npu, AdamW};
use crate::device::{backend, Backend};
use crate::error::Result;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// [`adamw_step`] on `stream`'s device: step `step` (1-based) of `params`, `m`, `v` in place.
pub fn step(
    stream: &Stream,
    params: &mut BufferViewMut<'_, f32>,
    grads: &BufferView<'_, f32>,
    m: &mut BufferViewMut<'_, f32>,
    v: &mut BufferViewMut<'_, f32>,
    step: u64,
    hp: &AdamW,
) -> Result<()> {
    let devices = [params.device(), grads.device(), m.device(), v.device()];
    match backend("adamw_step", stream, &devices)? {
        Backend::Cpu => adamw_step(
            params.as_host_slice_mut()?,
            grads.as_host_slice()?,
            m.as_host_slice_mut()?,
            v.as_host_slice_mut()?,
            step,
            hp,
        ),
        Backend::Npu(ordinal) => npu::step(ordinal, stream, params, grads, m, v, step, hp),
    }
}
