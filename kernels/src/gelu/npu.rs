//! GELU's NPU bodies: aclnnGeluV2 and aclnnGeluBackwardV2 (aclnn_gelu_v2.h,
//! aclnn_gelu_backward_v2.h of CANN 8.x), both on `[N]` tensors over the views.
//!
//! The V2 ops name the approximation, and we pass the exact (erf) form, which is what the CPU
//! kernel computes and what transformers' `"gelu"` (the Mistral3 projector's
//! `projector_hidden_act`) means: `approximate = 0` for the forward (an int64: 0 = "none",
//! 1 = "tanh"), `approximate = "none"` for the backward (a C string). The V1 ops
//! (aclnnGelu / aclnnGeluBackward) take no mode, so which form they compute is the op's
//! choice; V2 leaves nothing implicit.
//!
//! aclnnGeluBackwardV2 writes the input gradient (it does not accumulate), so the body
//! computes it into an `[N]` scratch and adds it into `dx` with aclnnInplaceAdd, as our
//! backward accumulates (`dx +=`).
#![cfg_attr(
    not(feature = "npu"),
    allow(unused_variables, unused_imports, dead_code)
)]

use crate::backend::npu_body;
use crate::error::Result;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// aclnnGeluV2's `approximate` for the erf form.
const APPROXIMATE_NONE: i64 = 0;

/// `aclnnGeluV2(x, approximate = 0 ("none"), y)`.
pub fn forward<E: Float>(
    ordinal: u32,
    stream: &Stream,
    y: &mut BufferViewMut<'_, E>,
    x: &BufferView<'_, E>,
) -> Result<()> {
    const OP: &str = "gelu_forward";
    npu_body!(OP, ordinal, "aclnnGeluV2", {
        use crate::backend::aclnn::{aclnn, AclTensor};
        super::check_forward(y.len(), x.len())?;
        if x.is_empty() {
            return Ok(());
        }
        let n = [x.len()];
        let xt = AclTensor::from_view(OP, x, &n)?;
        let yt = AclTensor::from_view_mut(OP, y, &n)?;
        aclnn!(
            OP,
            stream,
            aclnnGeluV2GetWorkspaceSize,
            aclnnGeluV2,
            (xt.raw(), APPROXIMATE_NONE, yt.raw())
        )
    })
}

/// `aclnnGeluBackwardV2(gradOutput = dy, self = x, approximate = "none", gradInput = g)` into
/// an `[N]` scratch g, then `dx += g` (aclnnInplaceAdd).
pub fn backward<E: Float>(
    ordinal: u32,
    stream: &Stream,
    dx: &mut BufferViewMut<'_, E>,
    dy: &BufferView<'_, E>,
    x: &BufferView<'_, E>,
) -> Result<()> {
    const OP: &str = "gelu_backward";
    npu_body!(OP, ordinal, "aclnnGeluBackwardV2 + aclnnInplaceAdd", {
        use crate::backend::aclnn::{aclnn, AclTensor};
        use cannon_runtime::DeviceBuffer;
        super::check_backward(dx.len(), dy.len(), x.len())?;
        if x.is_empty() {
            return Ok(());
        }
        let n = [x.len()];
        let mut g = DeviceBuffer::<E>::alloc(stream, x.len())?;
        {
            let dyt = AclTensor::from_view(OP, dy, &n)?;
            let xt = AclTensor::from_view(OP, x, &n)?;
            let gt = AclTensor::from_buffer(OP, &mut g, &n)?;
            // The op reads the mode during phase 1; the string outlives the call.
            let mut mode = *b"none\0";
            aclnn!(
                OP,
                stream,
                aclnnGeluBackwardV2GetWorkspaceSize,
                aclnnGeluBackwardV2,
                (
                    dyt.raw(),
                    xt.raw(),
                    mode.as_mut_ptr() as *mut std::ffi::c_char,
                    gt.raw()
                )
            )?;
        }
        crate::elementwise::npu::add_into(ordinal, stream, dx, &g.view())
    })
}
