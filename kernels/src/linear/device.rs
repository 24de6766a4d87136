//! linear over runtime buffers: the CPU path is the slice-level functions on the host slices,
//! the NPU path [`super::npu`]. Shapes as in the slice-level API:
//!
//! ```text
//! x: [T, I]   w: [O, I]   b: [O]   y, dy: [T, O]   dx: [T, I] f32   dw: [O, I] f32   db: [O] f32
//! ```

use super::{
    linear_backward, linear_backward_bf16, linear_forward, linear_forward_bf16,
    linear_forward_bf16_to_bf16, npu, LinearDims, LinearGrads,
};
use crate::device::{backend, present, Backend};
use crate::error::Result;
use crate::gemm::Bf16Elem;
use cannon_runtime::{BufferView, BufferViewMut, Device, Stream};
use half::bf16;

/// The gradients a device-level backward accumulates into; `None` skips one.
pub struct Grads<'a> {
    /// `[T, I]`
    pub dx: Option<BufferViewMut<'a, f32>>,
    /// `[O, I]`, e.g. a window of a layer's flat gradient buffer.
    pub dw: Option<BufferViewMut<'a, f32>>,
    /// `[O]`
    pub db: Option<BufferViewMut<'a, f32>>,
}

impl Grads<'_> {
    fn devices(&self) -> [Option<Device>; 3] {
        [
            self.dx.as_ref().map(|v| v.device()),
            self.dw.as_ref().map(|v| v.device()),
            self.db.as_ref().map(|v| v.device()),
        ]
    }

    /// The slice-level gradients over the same (host) memory.
    fn host(&mut self) -> Result<LinearGrads<'_>> {
        Ok(LinearGrads {
            dx: self
                .dx
                .as_mut()
                .map(|v| v.as_host_slice_mut())
                .transpose()?,
            dw: self
                .dw
                .as_mut()
                .map(|v| v.as_host_slice_mut())
                .transpose()?,
            db: self
                .db
                .as_mut()
                .map(|v| v.as_host_slice_mut())
                .transpose()?,
        })
    }
}

/// [`linear_forward`] on `stream`'s device: `Y = X W^T (+ b)`, f32.
pub fn forward(
    stream: &Stream,
    y: &mut BufferViewMut<'_, f32>,
    x: &BufferView<'_, f32>,
    w: &BufferView<'_, f32>,
    b: Option<&BufferView<'_, f32>>,
    d: LinearDims,
) -> Result<()> {
    let devices = present(
        &[y.device(), x.device(), w.device()],
        &[b.map(|b| b.device())],
    );
    match backend("linear_forward", stream, &devices)? {
        Backend::Cpu => linear_forward(
            y.as_host_slice_mut()?,
            x.as_host_slice()?,
            w.as_host_slice()?,
            b.map(|b| b.as_host_slice()).transpose()?,
            d,
        ),
        Backend::Npu(ordinal) => npu::forward(ordinal, stream, y, x, w, b, d),
    }
}

/// [`linear_backward`] on `stream`'s device: accumulates the gradients present in `g`, f32.
pub fn backward(
    stream: &Stream,
    mut g: Grads<'_>,
    dy: &BufferView<'_, f32>,
    x: &BufferView<'_, f32>,
    w: &BufferView<'_, f32>,
    d: LinearDims,
) -> Result<()> {
    let devices = present(&[dy.device(), x.device(), w.device()], &g.devices());
    match backend("linear_backward", stream, &devices)? {
        Backend::Cpu => linear_backward(
            g.host()?,
            dy.as_host_slice()?,
            x.as_host_slice()?,
            w.as_host_slice()?,
            d,
        ),
        Backend::Npu(ordinal) => npu::backward(ordinal, stream, g, dy, x, w, d),
    }
}

/// [`linear_forward_bf16`] on `stream`'s device: bf16 products, f32 Y.
pub fn forward_bf16<
    X: Bf16Elem + cannon_runtime::Element,
    W: Bf16Elem + cannon_runtime::Element,
>(
    stream: &Stream,
    y: &mut BufferViewMut<'_, f32>,
    x: &BufferView<'_, X>,
    w: &BufferView<'_, W>,
    b: Option<&BufferView<'_, W>>,
    d: LinearDims,
) -> Result<()> {
    let devices = present(
        &[y.device(), x.device(), w.device()],
        &[b.map(|b| b.device())],
    );
    match backend("linear_forward_bf16", stream, &devices)? {
        Backend::Cpu => linear_forward_bf16(
            y.as_host_slice_mut()?,
            x.as_host_slice()?,
            w.as_host_slice()?,
            b.map(|b| b.as_host_slice()).transpose()?,
            d,
        ),
        Backend::Npu(ordinal) => npu::forward_bf16(ordinal, stream, y, x, w, b, d),
    }
}

/// [`linear_forward_bf16_to_bf16`] on `stream`'s device: bf16 products, bf16 Y.
pub fn forward_bf16_to_bf16<
    X: Bf16Elem + cannon_runtime::Element,
    W: Bf16Elem + cannon_runtime::Element,
>(
    stream: &Stream,
    y: &mut BufferViewMut<'_, bf16>,
    x: &BufferView<'_, X>,
    w: &BufferView<'_, W>,
    b: Option<&BufferView<'_, W>>,
    d: LinearDims,
) -> Result<()> {
    let devices = present(
        &[y.device(), x.device(), w.device()],
        &[b.map(|b| b.device())],
    );
    match backend("linear_forward_bf16", stream, &devices)? {
        Backend::Cpu => linear_forward_bf16_to_bf16(
            y.as_host_slice_mut()?,
            x.as_host_slice()?,
            w.as_host_slice()?,
            b.map(|b| b.as_host_slice()).transpose()?,
            d,
        ),
        Backend::Npu(ordinal) => npu::forward_bf16_to_bf16(ordinal, stream, y, x, w, b, d),
    }
}

/// [`linear_backward_bf16`] on `stream`'s device: bf16 products, f32 gradients.
pub fn backward_bf16<
    G: Bf16Elem + cannon_runtime::Element,
    X: Bf16Elem + cannon_runtime::Element,
    W: Bf16Elem + cannon_runtime::Element,
>(
    stream: &Stream,
    mut g: Grads<'_>,
    dy: &BufferView<'_, G>,
    x: &BufferView<'_, X>,
    w: &BufferView<'_, W>,
    d: LinearDims,
) -> Result<()> {
    let devices = present(&[dy.device(), x.device(), w.device()], &g.devices());
    match backend("linear_backward_bf16", stream, &devices)? {
        Backend::Cpu => linear_backward_bf16(
            g.host()?,
            dy.as_host_slice()?,
            x.as_host_slice()?,
            w.as_host_slice()?,
            d,
        ),
        Backend::Npu(ordinal) => npu::backward_bf16(ordinal, stream, g, dy, x, w, d),
    }
}
