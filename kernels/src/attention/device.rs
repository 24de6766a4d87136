//! Attention on runtime buffers: the device-level entry points
//! (re-exported by [`crate::ops`]).
//!
//! Each runs the op's check (the rule its slice-level function and NPU body apply too, so
//! the meta device rejects what the CPU would), selects the backend once (every operand on
//! the stream's device, [`backend::select`]), and matches on it: the CPU arm
//! ([`on_cpu`]) borrows the buffers' host slices for [`super::host`], the NPU arm is the
//! op's aclnn body (`npu.rs`), the meta arm computes nothing.

use super::npu;
use super::{BlockAttention, Qkv, QkvBuf, QkvGrad, QkvGradBuf, VarlenAttention};
use crate::backend::{self, Npu, Selected};
use crate::error::Result;
use cannon_runtime::trace;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// [`crate::attention::host::forward`] on `stream`'s device:
/// Varlen attention forward: writes `out` and `lse` ([`crate::attention`]).
pub fn attention_forward<E: Float>(
    stream: &Stream,
    a: &VarlenAttention,
    x: QkvBuf<'_, E>,
    out: &mut BufferViewMut<'_, E>,
    lse: &mut BufferViewMut<'_, f32>,
) -> Result<()> {
    let per_head = super::lse_per_head(stream.device());
    super::check_forward(a, per_head, x.lens(), out.len(), lse.len())?;
    let _span = trace::span_on(stream, "attention_forward", trace::Cat::Attention);
    match backend::select("attention_forward", stream, &[&x, &out, &lse])? {
        Selected::Cpu(_) => on_cpu::attention_forward(a, x, out, lse),
        Selected::Npu(Npu { ordinal }) => npu::forward(ordinal, stream, a, x, out, lse),
        Selected::Meta(_) => Ok(()),
    }
}

/// [`crate::attention::host::backward`] on `stream`'s device:
/// Varlen attention backward: overwrites dq, dk, dv.
pub fn attention_backward<E: Float>(
    stream: &Stream,
    a: &VarlenAttention,
    x: QkvBuf<'_, E>,
    out: &BufferView<'_, E>,
    lse: &BufferView<'_, f32>,
    dout: &BufferView<'_, E>,
    g: QkvGradBuf<'_, '_, E>,
) -> Result<()> {
    let per_head = super::lse_per_head(stream.device());
    let saved = (out.len(), lse.len(), dout.len());
    super::check_backward(a, per_head, x.lens(), saved, g.lens())?;
    let _span = trace::span_on(stream, "attention_backward", trace::Cat::Attention);
    match backend::select("attention_backward", stream, &[&x, &out, &lse, &dout, &g])? {
        Selected::Cpu(_) => on_cpu::attention_backward(a, x, out, lse, dout, g),
        Selected::Npu(Npu { ordinal }) => npu::backward(ordinal, stream, a, x, out, lse, dout, g),
        Selected::Meta(_) => Ok(()),
    }
}

/// [`crate::attention::host::block_forward_merge`] on `stream`'s device:
/// Ring attention block forward: merges into the f32 `out` and `lse` accumulators
/// (`lse` in the device's form: [`crate::attention::block_lse_init`]).
pub fn attention_block_forward<E: Float>(
    stream: &Stream,
    a: &BlockAttention,
    x: QkvBuf<'_, E>,
    out: &mut BufferViewMut<'_, f32>,
    lse: &mut BufferViewMut<'_, f32>,
) -> Result<()> {
    let per_head = super::lse_per_head(stream.device());
    let (ol, ll) = (out.len(), lse.len());
    super::check_block_forward(a, per_head, x.lens(), ol, ll)?;
    let _span = trace::span_on(stream, "attention_block_forward", trace::Cat::Attention);
    match backend::select("attention_block_forward", stream, &[&x, &out, &lse])? {
        Selected::Cpu(_) => on_cpu::attention_block_forward(a, x, out, lse),
        Selected::Npu(Npu { ordinal }) => npu::block_forward(ordinal, stream, a, x, out, lse),
        Selected::Meta(_) => Ok(()),
    }
}

/// [`crate::attention::host::block_backward_accumulate`] on `stream`'s device:
/// Ring attention block backward: adds into the f32 dq, dk, dv accumulators.
pub fn attention_block_backward<E: Float>(
    stream: &Stream,
    a: &BlockAttention,
    x: QkvBuf<'_, E>,
    out: &BufferView<'_, E>,
    lse: &BufferView<'_, f32>,
    dout: &BufferView<'_, E>,
    g: QkvGradBuf<'_, '_, f32>,
) -> Result<()> {
    let per_head = super::lse_per_head(stream.device());
    let saved = (out.len(), lse.len(), dout.len());
    super::check_block_backward(a, per_head, x.lens(), saved, g.lens())?;
    let _span = trace::span_on(stream, "attention_block_backward", trace::Cat::Attention);
    match backend::select(
        "attention_block_backward",
        stream,
        &[&x, &out, &lse, &dout, &g],
    )? {
        Selected::Cpu(_) => on_cpu::attention_block_backward(a, x, out, lse, dout, g),
        Selected::Npu(Npu { ordinal }) => {
            npu::block_backward(ordinal, stream, a, x, out, lse, dout, g)
        }
        Selected::Meta(_) => Ok(()),
    }
}

/// The CPU arm of each entry point: the buffers' host slices passed to the slice-level
/// function, without the entry's check or device selection (the slice-level function checks
/// by itself; tests compare the two).
pub mod on_cpu {
    use super::*;
    use crate::attention::host;

    pub fn attention_forward<E: Float>(
        a: &VarlenAttention,
        x: QkvBuf<'_, E>,
        out: &mut BufferViewMut<'_, E>,
        lse: &mut BufferViewMut<'_, f32>,
    ) -> Result<()> {
        let qkv = Qkv {
            q: x.q.as_host_slice()?,
            k: x.k.as_host_slice()?,
            v: x.v.as_host_slice()?,
        };
        host::forward(a, qkv, out.as_host_slice_mut()?, lse.as_host_slice_mut()?)
    }

    pub fn attention_backward<E: Float>(
        a: &VarlenAttention,
        x: QkvBuf<'_, E>,
        out: &BufferView<'_, E>,
        lse: &BufferView<'_, f32>,
        dout: &BufferView<'_, E>,
        g: QkvGradBuf<'_, '_, E>,
    ) -> Result<()> {
        let qkv = Qkv {
            q: x.q.as_host_slice()?,
            k: x.k.as_host_slice()?,
            v: x.v.as_host_slice()?,
        };
        let grads = QkvGrad {
            dq: g.dq.as_host_slice_mut()?,
            dk: g.dk.as_host_slice_mut()?,
            dv: g.dv.as_host_slice_mut()?,
        };
        host::backward(
            a,
            qkv,
            out.as_host_slice()?,
            lse.as_host_slice()?,
            dout.as_host_slice()?,
            grads,
        )
    }

    pub fn attention_block_forward<E: Float>(
        a: &BlockAttention,
        x: QkvBuf<'_, E>,
        out: &mut BufferViewMut<'_, f32>,
        lse: &mut BufferViewMut<'_, f32>,
    ) -> Result<()> {
        let (q, k, v) = (
            x.q.as_host_slice()?,
            x.k.as_host_slice()?,
            x.v.as_host_slice()?,
        );
        let (out, lse) = (out.as_host_slice_mut()?, lse.as_host_slice_mut()?);
        host::block_forward_merge(a, q, k, v, out, lse)
    }

    pub fn attention_block_backward<E: Float>(
        a: &BlockAttention,
        x: QkvBuf<'_, E>,
        out: &BufferView<'_, E>,
        lse: &BufferView<'_, f32>,
        dout: &BufferView<'_, E>,
        g: QkvGradBuf<'_, '_, f32>,
    ) -> Result<()> {
        let qkv = (
            x.q.as_host_slice()?,
            x.k.as_host_slice()?,
            x.v.as_host_slice()?,
        );
        let (out, lse, dout) = (
            out.as_host_slice()?,
            lse.as_host_slice()?,
            dout.as_host_slice()?,
        );
        let (dq, dk, dv) = (
            g.dq.as_host_slice_mut()?,
            g.dk.as_host_slice_mut()?,
            g.dv.as_host_slice_mut()?,
        );
        host::block_backward_accumulate(a, qkv, out, lse, dout, dq, dk, dv)
    }
}
