//! Varlen attention over runtime buffers: the CPU path is [`forward`](super::forward) /
//! [`backward`](super::backward) on the buffers' host slices, the NPU path [`super::npu`].
//! Shapes as in the slice-level API (`cu_seqlens` is host data: it describes the call):
//!
//! ```text
//! q, out, dout, dq [T, Hq, D]   k, v, dk, dv [T, Hkv, D]   lse [T, Hq] f32
//! ```

use super::{npu, Element, Qkv, QkvGrad, VarlenAttention};
use crate::device::{backend, Backend};
use crate::error::Result;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// q, k, v on a device.
#[derive(Clone, Copy, Debug)]
pub struct QkvBuf<'a, E: cannon_runtime::Element> {
    pub q: &'a BufferView<'a, E>,
    pub k: &'a BufferView<'a, E>,
    pub v: &'a BufferView<'a, E>,
}

/// Gradients of q, k, v on a device (overwritten by [`backward`]).
#[derive(Debug)]
pub struct QkvGradBuf<'a, 'b, E: cannon_runtime::Element> {
    pub dq: &'a mut BufferViewMut<'b, E>,
    pub dk: &'a mut BufferViewMut<'b, E>,
    pub dv: &'a mut BufferViewMut<'b, E>,
}

/// [`super::forward`] on `stream`'s device: writes `out` and `lse`.
pub fn forward<E: Element + cannon_runtime::Element>(
    stream: &Stream,
    a: &VarlenAttention,
    x: QkvBuf<'_, E>,
    out: &mut BufferViewMut<'_, E>,
    lse: &mut BufferViewMut<'_, f32>,
) -> Result<()> {
    let devices = [
        x.q.device(),
        x.k.device(),
        x.v.device(),
        out.device(),
        lse.device(),
    ];
    match backend("attention_forward", stream, &devices)? {
        Backend::Cpu => super::forward(
            a,
            Qkv {
                q: x.q.as_host_slice()?,
                k: x.k.as_host_slice()?,
                v: x.v.as_host_slice()?,
            },
            out.as_host_slice_mut()?,
            lse.as_host_slice_mut()?,
        ),
        Backend::Npu(ordinal) => npu::forward(ordinal, stream, a, x, out, lse),
    }
}

/// [`super::backward`] on `stream`'s device: overwrites `dq`, `dk`, `dv`.
pub fn backward<E: Element + cannon_runtime::Element>(
    stream: &Stream,
    a: &VarlenAttention,
    x: QkvBuf<'_, E>,
    out: &BufferView<'_, E>,
    lse: &BufferView<'_, f32>,
    dout: &BufferView<'_, E>,
    g: QkvGradBuf<'_, '_, E>,
) -> Result<()> {
    let devices = [
        x.q.device(),
        x.k.device(),
        x.v.device(),
        out.device(),
        lse.device(),
        dout.device(),
        g.dq.device(),
        g.dk.device(),
        g.dv.device(),
    ];
    match backend("attention_backward", stream, &devices)? {
        Backend::Cpu => super::backward(
            a,
            Qkv {
                q: x.q.as_host_slice()?,
                k: x.k.as_host_slice()?,
                v: x.v.as_host_slice()?,
            },
            out.as_host_slice()?,
            lse.as_host_slice()?,
            dout.as_host_slice()?,
            QkvGrad {
                dq: g.dq.as_host_slice_mut()?,
                dk: g.dk.as_host_slice_mut()?,
                dv: g.dv.as_host_slice_mut()?,
            },
        ),
        Backend::Npu(ordinal) => npu::backward(ordinal, stream, a, x, out, lse, dout, g),
    }
}
