//! AdamW on runtime buffers: the device-level entry points
//! (re-exported by [`crate::ops`]).
//!
//! Each runs the op's check (the rule its slice-level function and NPU body apply too, so
//! the meta device rejects what the CPU would), selects the backend once (every operand on
//! the stream's device, [`backend::select`]), and matches on it: the CPU arm
//! ([`on_cpu`]) borrows the buffers' host slices for [`super::host`], the NPU arm is the
//! op's aclnn body (`npu.rs`), the meta arm computes nothing.

use super::npu;
use super::AdamW;
use crate::backend::{self, Npu, Selected};
use crate::error::Result;
use cannon_runtime::trace;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// [`crate::adamw::host::adamw_step`] on `stream`'s device:
/// One AdamW step of `params`, `m`, `v` in place ([`crate::adamw`]).
pub fn adamw_step(
    stream: &Stream,
    params: &mut BufferViewMut<'_, f32>,
    grads: &BufferView<'_, f32>,
    m: &mut BufferViewMut<'_, f32>,
    v: &mut BufferViewMut<'_, f32>,
    step: u64,
    hp: &AdamW,
) -> Result<()> {
    super::check_step(params.len(), grads.len(), m.len(), v.len(), step, hp)?;
    let _span = trace::span_on(stream, "adamw_step", trace::Cat::Optimizer);
    match backend::select("adamw_step", stream, &[&params, &grads, &m, &v])? {
        Selected::Cpu(_) => on_cpu::adamw_step(params, grads, m, v, step, hp),
        Selected::Npu(Npu { ordinal }) => npu::step(ordinal, stream, params, grads, m, v, step, hp),
        Selected::Meta(_) => Ok(()),
    }
}

/// The CPU arm of each entry point: the buffers' host slices passed to the slice-level
/// function, without the entry's check or device selection (the slice-level function checks
/// by itself; tests compare the two).
pub mod on_cpu {
    use super::*;
    use crate::adamw::host;

    pub fn adamw_step(
        params: &mut BufferViewMut<'_, f32>,
        grads: &BufferView<'_, f32>,
        m: &mut BufferViewMut<'_, f32>,
        v: &mut BufferViewMut<'_, f32>,
        step: u64,
        hp: &AdamW,
    ) -> Result<()> {
        host::adamw_step(
            params.as_host_slice_mut()?,
            grads.as_host_slice()?,
            m.as_host_slice_mut()?,
            v.as_host_slice_mut()?,
            step,
            hp,
        )
    }
}
