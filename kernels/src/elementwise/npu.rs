//! Elementwise ops' NPU bodies: one aclnn call each on `[N]` tensors over the views:
//! `aclnnInplaceAdd(self = y, other = x, alpha = 1)`, `aclnnMul(self = a, other = b, out)`,
//! `aclnnInplaceMul(self = y, other = x)` (aclnn_add.h, aclnn_mul.h; docs/cann-api.md §4).
//! bf16 operands compute in f32 and round once on store, as on the CPU.
#![cfg_attr(
    not(feature = "npu"),
    allow(unused_variables, unused_imports, dead_code)
)]

use crate::backend::npu_body;
use crate::error::Result;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// `aclnnInplaceAdd(y, x, alpha = 1)`.
pub fn add_into<E: Float>(
    ordinal: u32,
    stream: &Stream,
    y: &mut BufferViewMut<'_, E>,
    x: &BufferView<'_, E>,
) -> Result<()> {
    const OP: &str = "add_into";
    npu_body!(OP, ordinal, "aclnnInplaceAdd", {
        use crate::backend::aclnn::{aclnn, AclScalar, AclTensor};
        super::check_add_into(y.len(), x.len())?;
        if y.is_empty() {
            return Ok(());
        }
        let n = [y.len()];
        let yt = AclTensor::from_view_mut(OP, y, &n)?;
        let xt = AclTensor::from_view(OP, x, &n)?;
        let alpha = AclScalar::f32(OP, 1.0)?;
        aclnn!(
            OP,
            stream,
            aclnnInplaceAddGetWorkspaceSize,
            aclnnInplaceAdd,
            (yt.raw(), xt.raw(), alpha.raw())
        )
    })
}

/// `aclnnMul(a, b, out)`.
pub fn mul<E: Float>(
    ordinal: u32,
    stream: &Stream,
    out: &mut BufferViewMut<'_, E>,
    a: &BufferView<'_, E>,
    b: &BufferView<'_, E>,
) -> Result<()> {
    const OP: &str = "mul";
    npu_body!(OP, ordinal, "aclnnMul", {
        use crate::backend::aclnn::{aclnn, AclTensor};
        super::check_mul(out.len(), a.len(), b.len())?;
        if out.is_empty() {
            return Ok(());
        }
        let n = [out.len()];
        let ot = AclTensor::from_view_mut(OP, out, &n)?;
        let at = AclTensor::from_view(OP, a, &n)?;
        let bt = AclTensor::from_view(OP, b, &n)?;
        aclnn!(
            OP,
            stream,
            aclnnMulGetWorkspaceSize,
            aclnnMul,
            (at.raw(), bt.raw(), ot.raw())
        )
    })
}

/// `aclnnInplaceMul(y, x)`.
pub fn mul_into<E: Float>(
    ordinal: u32,
    stream: &Stream,
    y: &mut BufferViewMut<'_, E>,
    x: &BufferView<'_, E>,
) -> Result<()> {
    const OP: &str = "mul_into";
    npu_body!(OP, ordinal, "aclnnInplaceMul", {
        use crate::backend::aclnn::{aclnn, AclTensor};
        super::check_mul_into(y.len(), x.len())?;
        if y.is_empty() {
            return Ok(());
        }
        let n = [y.len()];
        let yt = AclTensor::from_view_mut(OP, y, &n)?;
        let xt = AclTensor::from_view(OP, x, &n)?;
        aclnn!(
            OP,
            stream,
            aclnnInplaceMulGetWorkspaceSize,
            aclnnInplaceMul,
            (yt.raw(), xt.raw())
        )
    })
}
