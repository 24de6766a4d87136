//! SwiGLU's NPU bodies: aclnnSwiGlu and aclnnSwiGluGrad (aclnn_swi_glu{,_grad}.h;
//! docs/cann-api.md §4).
//!
//! aclnnSwiGlu takes gate and up as the two halves of one tensor along `dim`. Our gate and up
//! are separate `[N]` views, so the body copies them (memcpy_dtod) into the rows of a
//! `[2, Np]` scratch x and calls the op with `dim = 0`. Np is N rounded up to 32 bytes of
//! elements and the padding is zero, so both halves start 32-byte aligned (aclnn's address
//! rule) and the padding computes silu(0) * 0 = 0, which nobody reads. The result `[1, Np]`
//! is copied back into h. The grad op writes `[d_gate | d_up]` (it does not accumulate); the
//! body adds the two rows into d_gate and d_up with aclnnInplaceAdd.
//!
//! For bf16 the CPU kernel rounds silu(gate) to bf16 before the product (transformers' order);
//! aclnnSwiGlu's rounding must be checked against it on hardware (the emulator runs the CPU
//! kernel).
#![cfg_attr(
    not(feature = "npu"),
    allow(unused_variables, unused_imports, dead_code)
)]

use crate::backend::npu_body;
use crate::error::Result;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// N rounded up so that N elements of `E` fill whole 32-byte units.
fn padded<E: Float>(n: usize) -> usize {
    let per = 32 / std::mem::size_of::<E>();
    n.div_ceil(per) * per
}

#[cfg(feature = "npu")]
fn stack<E: Float>(
    stream: &Stream,
    rows: &[&BufferView<'_, E>],
    np: usize,
) -> Result<cannon_runtime::DeviceBuffer<E>> {
    let mut x = cannon_runtime::DeviceBuffer::<E>::alloc_zeros(stream, rows.len() * np)?;
    for (i, r) in rows.iter().enumerate() {
        x.slice_mut(i * np..i * np + r.len())?
            .memcpy_dtod(stream, r)?;
    }
    Ok(x)
}

/// `aclnnSwiGlu(x = [gate; up] as [2, Np], dim = 0, out [1, Np])`, then h = out[..N].
pub fn forward<E: Float>(
    ordinal: u32,
    stream: &Stream,
    h: &mut BufferViewMut<'_, E>,
    gate: &BufferView<'_, E>,
    up: &BufferView<'_, E>,
) -> Result<()> {
    const OP: &str = "swiglu_forward";
    npu_body!(OP, ordinal, "aclnnSwiGlu", {
        use crate::backend::aclnn::{aclnn, AclTensor};
        use cannon_runtime::DeviceBuffer;
        let n = gate.len();
        super::check_forward(h.len(), n, up.len())?;
        if n == 0 {
            return Ok(());
        }
        let np = padded::<E>(n);
        let mut x = stack(stream, &[gate, up], np)?;
        let mut out = DeviceBuffer::<E>::alloc(stream, np)?;
        {
            let xt = AclTensor::from_buffer(OP, &mut x, &[2, np])?;
            let ot = AclTensor::from_buffer(OP, &mut out, &[1, np])?;
            aclnn!(
                OP,
                stream,
                aclnnSwiGluGetWorkspaceSize,
                aclnnSwiGlu,
                (xt.raw(), 0i64, ot.raw())
            )?;
        }
        h.memcpy_dtod(stream, &out.slice(0..n)?)?;
        Ok(())
    })
}

/// `aclnnSwiGluGrad(yGrad = dh [1, Np], x = [gate; up], dim = 0, out = [dgate; dup])`, then
/// `d_gate += out[0]`, `d_up += out[1]`.
pub fn backward<E: Float>(
    ordinal: u32,
    stream: &Stream,
    d_gate: &mut BufferViewMut<'_, E>,
    d_up: &mut BufferViewMut<'_, E>,
    dh: &BufferView<'_, E>,
    gate: &BufferView<'_, E>,
    up: &BufferView<'_, E>,
) -> Result<()> {
    const OP: &str = "swiglu_backward";
    npu_body!(OP, ordinal, "aclnnSwiGluGrad + aclnnInplaceAdd", {
        use crate::backend::aclnn::{aclnn, AclTensor};
        use cannon_runtime::DeviceBuffer;
        let n = gate.len();
        super::check_backward(d_gate.len(), d_up.len(), dh.len(), n, up.len())?;
        if n == 0 {
            return Ok(());
        }
        let np = padded::<E>(n);
        let mut x = stack(stream, &[gate, up], np)?;
        let mut dy = stack(stream, &[dh], np)?;
        let mut dx = DeviceBuffer::<E>::alloc(stream, 2 * np)?;
        {
            let dyt = AclTensor::from_buffer(OP, &mut dy, &[1, np])?;
            let xt = AclTensor::from_buffer(OP, &mut x, &[2, np])?;
            let dxt = AclTensor::from_buffer(OP, &mut dx, &[2, np])?;
            aclnn!(
                OP,
                stream,
                aclnnSwiGluGradGetWorkspaceSize,
                aclnnSwiGluGrad,
                (dyt.raw(), xt.raw(), 0i64, dxt.raw())
            )?;
        }
        crate::elementwise::npu::add_into(ordinal, stream, d_gate, &dx.slice(0..n)?)?;
        crate::elementwise::npu::add_into(ordinal, stream, d_up, &dx.slice(np..np + n)?)
    })
}
