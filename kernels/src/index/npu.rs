//! Row gathers/scatters' and the batched transpose's NPU bodies, as compositions of bound
//! aclnn ops (aclnnIndexSelect / IndexCopy / IndexAdd / IndexFill / Permute are not among our
//! bindings; adding them needs the generator run on the CANN headers).
//!
//! The host indices are checked by the slice-level rules first (the bodies call the same
//! checks) and uploaded as an int64 tensor. Then, with `aclnnEmbedding(weight, indices, out)`
//! as the row gather (`out[i] = weight[indices[i]]`, exact: it moves values):
//!
//! ```text
//! gather_rows       out = Embedding(src [R, D], idx)
//! scatter_rows      S = [dst; src] ([R + K, D] scratch, two device copies),
//!                   map[r] = r, then map[idx[i]] = R + i in order of i (the last write wins,
//!                   as on the CPU);  dst = Embedding(S, map)
//! zero_rows         S = [dst; 0] ([R + 1, D]),  map[r] = r, map[idx[i]] = R;  dst = Embedding(S, map)
//! scatter_add_rows  A = EmbeddingDenseBackward(src as f32, idx, R)   ([R, D] f32, the sums of
//!                   each row's sources in f32), then dst += A (aclnnInplaceAdd; a bf16 dst is
//!                   widened, added and cast back: one rounding per row instead of the CPU's
//!                   one per source for repeated indices)
//! transpose         out [B, C, R] = aclnnCast(x viewed [B, C, R] with strides [R C, 1, C])
//!                   to its own dtype: a strided copy
//! ```
//!
//! Every path except scatter_add_rows is exact. The dtypes are those the ops take
//! (floats for Embedding; Cast also moves int32/int64); another element type is the op's own
//! typed error.
#![cfg_attr(
    not(feature = "npu"),
    allow(unused_variables, unused_imports, dead_code)
)]

use super::TransposeDims;
use crate::backend::npu_body;
use crate::error::Result;
use cannon_runtime::Element;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

#[cfg(feature = "npu")]
mod imp {
    use super::*;
    use crate::backend::aclnn::{aclnn, AclTensor};
    use cannon_runtime::DeviceBuffer;

    /// `out [K, D] = table [rows, D][map]` (aclnnEmbedding).
    pub(super) fn gather<T: Element>(
        op: &'static str,
        stream: &Stream,
        out: &mut BufferViewMut<'_, T>,
        table: &BufferView<'_, T>,
        rows: usize,
        map: &[i64],
        dim: usize,
    ) -> Result<()> {
        if map.is_empty() {
            return Ok(());
        }
        let mut idx = DeviceBuffer::<i64>::clone_htod(stream, map)?;
        let wt = AclTensor::from_view(op, table, &[rows, dim])?;
        let it = AclTensor::from_buffer(op, &mut idx, &[map.len()])?;
        let ot = AclTensor::from_view_mut(op, out, &[map.len(), dim])?;
        aclnn!(
            op,
            stream,
            aclnnEmbeddingGetWorkspaceSize,
            aclnnEmbedding,
            (wt.raw(), it.raw(), ot.raw())
        )
    }

    /// `[dst; extra]` in one scratch of `rows + extra_rows` rows (extra = None: zeros).
    pub(super) fn stacked<T: Element>(
        stream: &Stream,
        dst: &BufferView<'_, T>,
        extra: Option<&BufferView<'_, T>>,
        extra_rows: usize,
        dim: usize,
    ) -> Result<DeviceBuffer<T>> {
        let n = dst.len() + extra_rows * dim;
        let mut s = if extra.is_none() {
            DeviceBuffer::<T>::alloc_zeros(stream, n)?
        } else {
            DeviceBuffer::<T>::alloc(stream, n)?
        };
        s.slice_mut(0..dst.len())?.memcpy_dtod(stream, dst)?;
        if let Some(e) = extra {
            s.slice_mut(dst.len()..n)?.memcpy_dtod(stream, e)?;
        }
        Ok(s)
    }
}

/// `out = aclnnEmbedding(src [R, D], idx)`.
pub fn gather_rows<T: Element>(
    ordinal: u32,
    stream: &Stream,
    out: &mut BufferViewMut<'_, T>,
    src: &BufferView<'_, T>,
    idx: &[usize],
    dim: usize,
) -> Result<()> {
    const OP: &str = "gather_rows";
    npu_body!(OP, ordinal, "aclnnEmbedding", {
        let rows = super::check_gather_rows(out.len(), src.len(), idx, dim)?;
        let map: Vec<i64> = idx.iter().map(|&r| r as i64).collect();
        imp::gather(OP, stream, out, src, rows, &map, dim)
    })
}

/// `dst = aclnnEmbedding([dst; src], map)` (see the module docs).
pub fn scatter_rows<T: Element>(
    ordinal: u32,
    stream: &Stream,
    dst: &mut BufferViewMut<'_, T>,
    src: &BufferView<'_, T>,
    idx: &[usize],
    dim: usize,
) -> Result<()> {
    const OP: &str = "scatter_rows";
    npu_body!(OP, ordinal, "aclnnEmbedding over [dst; src]", {
        let rows = super::check_scatter_rows(OP, dst.len(), src.len(), idx, dim)?;
        if idx.is_empty() {
            return Ok(());
        }
        let s = imp::stacked(stream, &dst.as_view(), Some(src), idx.len(), dim)?;
        let mut map: Vec<i64> = (0..rows as i64).collect();
        for (i, &r) in idx.iter().enumerate() {
            map[r] = (rows + i) as i64;
        }
        imp::gather(OP, stream, dst, &s.view(), rows + idx.len(), &map, dim)
    })
}

/// `dst += aclnnEmbeddingDenseBackward(src, idx, R)` (see the module docs).
pub fn scatter_add_rows<E: Float>(
    ordinal: u32,
    stream: &Stream,
    dst: &mut BufferViewMut<'_, E>,
    src: &BufferView<'_, E>,
    idx: &[usize],
    dim: usize,
) -> Result<()> {
    const OP: &str = "scatter_add_rows";
    npu_body!(
        OP,
        ordinal,
        "aclnnEmbeddingDenseBackward + aclnnInplaceAdd",
        {
            use crate::backend::aclnn::{aclnn, AclTensor};
            use crate::gemm::npu::imp::{f32_operand, matrix};
            use cannon_runtime::{DType, DeviceBuffer};
            let rows = super::check_scatter_rows(OP, dst.len(), src.len(), idx, dim)?;
            if idx.is_empty() {
                return Ok(());
            }
            let map: Vec<i64> = idx.iter().map(|&r| r as i64).collect();
            let mut it = DeviceBuffer::<i64>::clone_htod(stream, &map)?;
            let s32 = f32_operand(stream, src, src.len(), false)?;
            let mut acc = DeviceBuffer::<f32>::alloc(stream, rows * dim)?;
            {
                let gt = matrix(OP, &s32, crate::gemm::Trans::N, idx.len(), dim, dim)?;
                let itt = AclTensor::from_buffer(OP, &mut it, &[idx.len()])?;
                let ot = AclTensor::from_buffer(OP, &mut acc, &[rows, dim])?;
                aclnn!(
                    OP,
                    stream,
                    aclnnEmbeddingDenseBackwardGetWorkspaceSize,
                    aclnnEmbeddingDenseBackward,
                    (gt.raw(), itt.raw(), rows as u64, u64::MAX, false, ot.raw())
                )?;
            }
            if E::DTYPE == DType::F32 {
                // dst is f32: add in place, described directly (one f32 op, one rounding).
                let dt = AclTensor::from_view_mut(OP, dst, &[rows, dim])?;
                let at = AclTensor::from_buffer(OP, &mut acc, &[rows, dim])?;
                let one = crate::backend::aclnn::AclScalar::f32(OP, 1.0)?;
                aclnn!(
                    OP,
                    stream,
                    aclnnInplaceAddGetWorkspaceSize,
                    aclnnInplaceAdd,
                    (dt.raw(), at.raw(), one.raw())
                )
            } else {
                // bf16 dst: widen (exact), add in f32, round once on the way back.
                let mut d32 = DeviceBuffer::<f32>::alloc(stream, dst.len())?;
                crate::cast::npu::convert(ordinal, stream, &dst.as_view(), &mut d32.view_mut())?;
                crate::elementwise::npu::add_into(
                    ordinal,
                    stream,
                    &mut d32.view_mut(),
                    &acc.view(),
                )?;
                crate::cast::npu::convert(ordinal, stream, &d32.view(), dst)
            }
        }
    )
}

/// `dst = aclnnEmbedding([dst; 0], map)` (see the module docs).
pub fn zero_rows<T: Element>(
    ordinal: u32,
    stream: &Stream,
    dst: &mut BufferViewMut<'_, T>,
    idx: &[usize],
    dim: usize,
) -> Result<()> {
    const OP: &str = "zero_rows";
    npu_body!(OP, ordinal, "aclnnEmbedding over [dst; 0]", {
        let rows = super::check_zero_rows(dst.len(), idx, dim)?;
        if idx.is_empty() {
            return Ok(());
        }
        let s = imp::stacked(stream, &dst.as_view(), None, 1, dim)?;
        let mut map: Vec<i64> = (0..rows as i64).collect();
        for &r in idx {
            map[r] = rows as i64;
        }
        imp::gather(OP, stream, dst, &s.view(), rows + 1, &map, dim)
    })
}

/// `out [B, C, R] = aclnnCast(x viewed [B, C, R] by strides)` to x's own dtype.
pub fn transpose<T: Element>(
    ordinal: u32,
    stream: &Stream,
    out: &mut BufferViewMut<'_, T>,
    x: &BufferView<'_, T>,
    d: TransposeDims,
) -> Result<()> {
    const OP: &str = "transpose";
    npu_body!(OP, ordinal, "aclnnCast of a strided view", {
        use crate::backend::aclnn::{aclnn, AclTensor};
        let n = super::check_transpose(out.len(), x.len(), d)?;
        if n == 0 {
            return Ok(());
        }
        let (b, r, c) = (d.batch as i64, d.rows as i64, d.cols as i64);
        // SAFETY: x's view holds n values of T.
        let xt = unsafe {
            AclTensor::strided::<T>(
                OP,
                x.as_raw_ptr() as *mut std::ffi::c_void,
                &[b, c, r],
                &[r * c, 1, c],
                &[n as i64],
            )
        }?;
        let ot = AclTensor::from_view_mut(OP, out, &[d.batch, d.cols, d.rows])?;
        aclnn!(
            OP,
            stream,
            aclnnCastGetWorkspaceSize,
            aclnnCast,
            (xt.raw(), T::DTYPE.acl_code(), ot.raw())
        )
    })
}
