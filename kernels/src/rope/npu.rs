//! RoPE's NPU bodies: `aclnnRotaryPositionEmbedding` (aclnn_rotary_position_embedding.h;
//! docs/cann-api.md §4) with mode 0 (rotate-half).
//!
//! Both bodies check `pos` against the table on the host, gather per token the rows
//! `cos = concat(c, c)`, `sin = concat(s, s)` (`[T, D]`, the rotate-half layout, in x's dtype
//! as the op requires) and upload them. x `[T, H, D]` is the op's BSND `[1, T, H, D]`, cos and
//! sin `[1, T, 1, D]`. The 2-D axial (Pixtral) RoPE needs no op of its own: its table already
//! lays the row angles and then the column angles out along D/2, so it is the same call with
//! that table's rows. The op writes a separate output; the bodies write a `[T, H, D]` scratch
//! and copy it back (`memcpy_dtod`) to keep the in-place contract.
//!
//! The backward is the inverse rotation, i.e. the same forward call with `-sin` (a rotation's
//! transpose is the rotation by the negated angle): this needs only the forward op, whereas
//! aclnnRotaryPositionEmbeddingGrad's handling of null dcos/dsin outputs is not documented.
//!
//! bf16: the op takes cos/sin in x's dtype, so they are rounded to bf16 (as transformers
//! does); the CPU keeps them f32 and rounds once on store, a difference inside the bf16 bar.
#![cfg_attr(
    not(feature = "npu"),
    allow(unused_variables, unused_imports, dead_code)
)]

use super::RopeTable;
use crate::backend::npu_body;
use crate::error::Result;
use cannon_runtime::Float;
use cannon_runtime::{BufferViewMut, Stream};

#[cfg(feature = "npu")]
fn rotate<E: Float>(
    op: &'static str,
    stream: &Stream,
    x: &mut BufferViewMut<'_, E>,
    n_heads: usize,
    table: &RopeTable,
    pos: &[u32],
    sign: f32,
) -> Result<()> {
    use crate::backend::aclnn::{aclnn, AclTensor};
    use cannon_runtime::DeviceBuffer;
    let d = table.head_dim();
    let t = pos.len();
    if t == 0 || n_heads == 0 {
        return Ok(());
    }
    let half = d / 2;
    let (mut cos, mut sin) = (Vec::with_capacity(t * d), Vec::with_capacity(t * d));
    for &p in pos {
        let (c, s) = (
            &table.cos[p as usize * half..(p as usize + 1) * half],
            &table.sin[p as usize * half..(p as usize + 1) * half],
        );
        for _ in 0..2 {
            cos.extend(c.iter().map(|&v| E::from_f32(v)));
            sin.extend(s.iter().map(|&v| E::from_f32(sign * v)));
        }
    }
    let mut cb = DeviceBuffer::<E>::clone_htod(stream, &cos)?;
    let mut sb = DeviceBuffer::<E>::clone_htod(stream, &sin)?;
    let mut out = DeviceBuffer::<E>::alloc(stream, x.len())?;
    {
        let xt = AclTensor::from_view(op, &x.as_view(), &[1, t, n_heads, d])?;
        let ct = AclTensor::from_buffer(op, &mut cb, &[1, t, 1, d])?;
        let st = AclTensor::from_buffer(op, &mut sb, &[1, t, 1, d])?;
        let ot = AclTensor::from_buffer(op, &mut out, &[1, t, n_heads, d])?;
        aclnn!(
            op,
            stream,
            aclnnRotaryPositionEmbeddingGetWorkspaceSize,
            aclnnRotaryPositionEmbedding,
            (xt.raw(), ct.raw(), st.raw(), 0i64, ot.raw())
        )?;
    }
    x.memcpy_dtod(stream, &out.view())?;
    Ok(())
}

/// `aclnnRotaryPositionEmbedding(x viewed [1, T, H, D] (BSND), cos, sin viewed [1, T, 1, D],
/// mode = 0 (rotate-half), out)`, copied back into x.
pub fn forward<E: Float>(
    ordinal: u32,
    stream: &Stream,
    x: &mut BufferViewMut<'_, E>,
    n_heads: usize,
    table: &RopeTable,
    pos: &[u32],
) -> Result<()> {
    const OP: &str = "rope_forward";
    npu_body!(OP, ordinal, "aclnnRotaryPositionEmbedding", {
        super::check_apply_len(OP, x.len(), n_heads, table, pos)?;
        rotate(OP, stream, x, n_heads, table, pos, 1.0)
    })
}

/// The inverse rotation: the forward call with `-sin`, in place on dx.
pub fn backward<E: Float>(
    ordinal: u32,
    stream: &Stream,
    dx: &mut BufferViewMut<'_, E>,
    n_heads: usize,
    table: &RopeTable,
    pos: &[u32],
) -> Result<()> {
    const OP: &str = "rope_backward";
    npu_body!(OP, ordinal, "aclnnRotaryPositionEmbedding (with -sin)", {
        super::check_apply_len(OP, dx.len(), n_heads, table, pos)?;
        rotate(OP, stream, dx, n_heads, table, pos, -1.0)
    })
}
