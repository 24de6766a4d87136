//! RoPE over runtime buffers: the CPU path is [`rope_forward`] / [`rope_backward`] on the host
//! slice, the NPU path [`super::npu`].
//!
//! ```text
//! x, dx: [T, H, D] (device, rotated in place)   table: cos/sin [slots, D/2] (host)
//! pos: [T] table slots (host)
//! ```
//!
//! The table and the positions stay on the host: the positions are checked against the table
//! there, and the NPU path gathers the per-token cos/sin rows from them and uploads those.

use super::{npu, rope_backward, rope_forward, RopeTable};
use crate::cast::Elem;
use crate::device::{backend, Backend};
use crate::error::Result;
use cannon_runtime::{BufferViewMut, Stream};

/// [`rope_forward`] on `stream`'s device: rotates `x` in place by the angles of `pos`.
pub fn forward<E: Elem + cannon_runtime::Element>(
    stream: &Stream,
    x: &mut BufferViewMut<'_, E>,
    n_heads: usize,
    table: &RopeTable,
    pos: &[u32],
) -> Result<()> {
    match backend("rope_forward", stream, &[x.device()])? {
        Backend::Cpu => rope_forward(x.as_host_slice_mut()?, n_heads, table, pos),
        Backend::Npu(ordinal) => npu::forward(ordinal, stream, x, n_heads, table, pos),
    }
}

/// [`rope_backward`] on `stream`'s device: the inverse rotation of `dx`, in place.
pub fn backward<E: Elem + cannon_runtime::Element>(
    stream: &Stream,
    dx: &mut BufferViewMut<'_, E>,
    n_heads: usize,
    table: &RopeTable,
    pos: &[u32],
) -> Result<()> {
    match backend("rope_backward", stream, &[dx.device()])? {
        Backend::Cpu => rope_backward(dx.as_host_slice_mut()?, n_heads, table, pos),
        Backend::Npu(ordinal) => npu::backward(ordinal, stream, dx, n_heads, table, pos),
    }
}
