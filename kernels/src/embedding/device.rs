//! Token embedding over runtime buffers: the CPU path is [`embedding_forward`] /
//! [`embedding_backward`] on the host slices, the NPU path [`super::npu`].
//!
//! ```text
//! ids: [T] u32 (host)   weight: [V, D]   out, dout: [T, D]   dweight: [V, D] f32
//! ```
//!
//! The ids are a host slice: they are checked against the vocabulary on the host (an id past
//! it is a typed error, never an out-of-bounds device read) and the NPU path uploads them.

use super::{embedding_backward, embedding_forward, npu};
use crate::cast::Elem;
use crate::device::{backend, Backend};
use crate::error::Result;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// [`embedding_forward`] on `stream`'s device: gathers rows `ids` of `weight` into `out`.
pub fn forward<E: Elem + cannon_runtime::Element>(
    stream: &Stream,
    out: &mut BufferViewMut<'_, E>,
    ids: &[u32],
    weight: &BufferView<'_, E>,
    dim: usize,
) -> Result<()> {
    match backend(
        "embedding_forward",
        stream,
        &[out.device(), weight.device()],
    )? {
        Backend::Cpu => {
            embedding_forward(out.as_host_slice_mut()?, ids, weight.as_host_slice()?, dim)
        }
        Backend::Npu(ordinal) => npu::forward(ordinal, stream, out, ids, weight, dim),
    }
}

/// [`embedding_backward`] on `stream`'s device: `dweight[ids[t]] += dout[t]`.
pub fn backward<E: Elem + cannon_runtime::Element>(
    stream: &Stream,
    dweight: &mut BufferViewMut<'_, f32>,
    dout: &BufferView<'_, E>,
    ids: &[u32],
    dim: usize,
) -> Result<()> {
    match backend(
        "embedding_backward",
        stream,
        &[dweight.device(), dout.device()],
    )? {
        Backend::Cpu => embedding_backward(
            dweight.as_host_slice_mut()?,
            dout.as_host_slice()?,
            ids,
            dim,
        ),
        Backend::Npu(ordinal) => npu::backward(ordinal, stream, dweight, dout, ids, dim),
    }
}
