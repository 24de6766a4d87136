//! The casts' NPU body: `aclnnCast(self = src, dtype = B's aclDataType, out = dst)`
//! (aclnn_cast.h; docs/cann-api.md §4). ACL_BF16 rounds to nearest even, ACL_FLOAT widens
//! exactly; a same-type call is a plain copy through the same op.
//!
//! To check on hardware: the CPU rounding is ties-to-even and keeps NaN payloads (quiet bit
//! set); aclnnCast's f32 -> bf16 must be compared bit for bit on the cast tests' inputs (ties,
//! overflow to infinity, NaN).
#![cfg_attr(
    not(feature = "npu"),
    allow(unused_variables, unused_imports, dead_code)
)]

use crate::backend::npu_body;
use crate::error::Result;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// `aclnnCast(src, B's aclDataType, dst)`.
pub fn convert<A: Float, B: Float>(
    ordinal: u32,
    stream: &Stream,
    src: &BufferView<'_, A>,
    dst: &mut BufferViewMut<'_, B>,
) -> Result<()> {
    const OP: &str = "cast";
    npu_body!(OP, ordinal, "aclnnCast", {
        use crate::backend::aclnn::{aclnn, AclTensor};
        super::check_cast(src.len(), dst.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let n = [src.len()];
        let st = AclTensor::from_view(OP, src, &n)?;
        let dt = AclTensor::from_view_mut(OP, dst, &n)?;
        aclnn!(
            OP,
            stream,
            aclnnCastGetWorkspaceSize,
            aclnnCast,
            (st.raw(), B::DTYPE.acl_code(), dt.raw())
        )
    })
}
