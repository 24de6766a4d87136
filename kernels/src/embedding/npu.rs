//! Embedding's NPU bodies (aclnn_embedding.h, aclnn_embedding_dense_backward.h;
//! docs/cann-api.md §4).
//!
//! Both bodies first check the ids on the host as the slice-level calls do (an id past the
//! vocabulary is a typed error naming the token, not a device fault), then upload them as
//! int64. The backward op writes a `[V, D]` gradient (it does not accumulate) in grad's
//! dtype, so the body widens a bf16 dout to f32 first (exact; the CPU sums in f32), runs
//! aclnnEmbeddingDenseBackward into a `[V, D]` f32 scratch with `paddingIdx = u64::MAX`
//! (torch's -1, no padding row, as torch_npu passes it) and adds it into dweight with
//! aclnnInplaceAdd. The scratch is as large as the table's gradient: the price of the op's
//! dense output.
#![cfg_attr(
    not(feature = "npu"),
    allow(unused_variables, unused_imports, dead_code)
)]

use crate::backend::npu_body;
use crate::error::Result;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// `aclnnEmbedding(weight [V, D], indices = ids [T], out [T, D])`.
pub fn forward<E: Float>(
    ordinal: u32,
    stream: &Stream,
    out: &mut BufferViewMut<'_, E>,
    ids: &[u32],
    weight: &BufferView<'_, E>,
    dim: usize,
) -> Result<()> {
    const OP: &str = "embedding_forward";
    npu_body!(OP, ordinal, "aclnnEmbedding", {
        use crate::backend::aclnn::{aclnn, AclTensor};
        use cannon_runtime::DeviceBuffer;
        let vocab = super::check_forward(out.len(), ids, weight.len(), dim)?;
        if ids.is_empty() {
            return Ok(());
        }
        let idx: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
        let mut idx = DeviceBuffer::<i64>::clone_htod(stream, &idx)?;
        let wt = AclTensor::from_view(OP, weight, &[vocab, dim])?;
        let it = AclTensor::from_buffer(OP, &mut idx, &[ids.len()])?;
        let ot = AclTensor::from_view_mut(OP, out, &[ids.len(), dim])?;
        aclnn!(
            OP,
            stream,
            aclnnEmbeddingGetWorkspaceSize,
            aclnnEmbedding,
            (wt.raw(), it.raw(), ot.raw())
        )
    })
}

/// `dweight += aclnnEmbeddingDenseBackward(dout (as f32), ids, V, paddingIdx = none)`.
pub fn backward<E: Float>(
    ordinal: u32,
    stream: &Stream,
    dweight: &mut BufferViewMut<'_, f32>,
    dout: &BufferView<'_, E>,
    ids: &[u32],
    dim: usize,
) -> Result<()> {
    const OP: &str = "embedding_backward";
    npu_body!(
        OP,
        ordinal,
        "aclnnEmbeddingDenseBackward + aclnnInplaceAdd",
        {
            use crate::backend::aclnn::{aclnn, AclTensor};
            use crate::gemm::npu::imp::f32_operand;
            use cannon_runtime::DeviceBuffer;
            let vocab = super::check_backward(dweight.len(), dout.len(), ids, dim)?;
            if ids.is_empty() {
                return Ok(());
            }
            let idx: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
            let mut idx = DeviceBuffer::<i64>::clone_htod(stream, &idx)?;
            let g32 = f32_operand(stream, dout, dout.len(), false)?;
            let mut acc = DeviceBuffer::<f32>::alloc(stream, vocab * dim)?;
            {
                let gt = crate::gemm::npu::imp::matrix(
                    OP,
                    &g32,
                    crate::gemm::Trans::N,
                    ids.len(),
                    dim,
                    dim,
                )?;
                let it = AclTensor::from_buffer(OP, &mut idx, &[ids.len()])?;
                let ot = AclTensor::from_buffer(OP, &mut acc, &[vocab, dim])?;
                aclnn!(
                    OP,
                    stream,
                    aclnnEmbeddingDenseBackwardGetWorkspaceSize,
                    aclnnEmbeddingDenseBackward,
                    (gt.raw(), it.raw(), vocab as u64, u64::MAX, false, ot.raw())
                )?;
            }
            crate::elementwise::npu::add_into(ordinal, stream, dweight, &acc.view())
        }
    )
}
