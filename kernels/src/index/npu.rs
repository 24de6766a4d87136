//! Row gathers/scatters' NPU entry points (bodies land with the NPU issue; until then they
//! return [`npu_pending`]: `NotCompiled` without `--features npu`, `Unsupported` with it).
//!
//! The host indices are checked by the slice-level rules first (the body calls the same
//! checks), uploaded as an int64 `[K]` tensor, then one aclnn call each on the `[R, D]` /
//! `[K, D]` views: aclnnIndexSelect (dim 0) for the gather, aclnnIndexCopy for the scatter,
//! aclnnIndexAdd for the scatter-add (its order for repeated indices must be checked against
//! the CPU's; the model's indices are unique), aclnnIndexFill with 0 for zeroing, and
//! aclnnPermute (dims [0, 2, 1]) into the output for the transpose.

use super::TransposeDims;
use crate::backend::npu_pending;
use crate::error::Result;
use cannon_runtime::Element;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// `aclnnIndexSelect(self = src, dim = 0, index = idx, out)`.
pub fn gather_rows<T: Element>(
    ordinal: u32,
    _stream: &Stream,
    _out: &mut BufferViewMut<'_, T>,
    _src: &BufferView<'_, T>,
    _idx: &[usize],
    _dim: usize,
) -> Result<()> {
    Err(npu_pending("gather_rows", ordinal, "aclnnIndexSelect"))
}

/// `aclnnIndexCopy(self = dst, dim = 0, index = idx, source = src)`.
pub fn scatter_rows<T: Element>(
    ordinal: u32,
    _stream: &Stream,
    _dst: &mut BufferViewMut<'_, T>,
    _src: &BufferView<'_, T>,
    _idx: &[usize],
    _dim: usize,
) -> Result<()> {
    Err(npu_pending("scatter_rows", ordinal, "aclnnIndexCopy"))
}

/// `aclnnIndexAdd(self = dst, dim = 0, index = idx, source = src, alpha = 1)`.
pub fn scatter_add_rows<E: Float>(
    ordinal: u32,
    _stream: &Stream,
    _dst: &mut BufferViewMut<'_, E>,
    _src: &BufferView<'_, E>,
    _idx: &[usize],
    _dim: usize,
) -> Result<()> {
    Err(npu_pending("scatter_add_rows", ordinal, "aclnnIndexAdd"))
}

/// `aclnnInplaceIndexFill(self = dst, dim = 0, index = idx, value = 0)`.
pub fn zero_rows<T: Element>(
    ordinal: u32,
    _stream: &Stream,
    _dst: &mut BufferViewMut<'_, T>,
    _idx: &[usize],
    _dim: usize,
) -> Result<()> {
    Err(npu_pending("zero_rows", ordinal, "aclnnInplaceIndexFill"))
}

/// `aclnnPermute(self = x as [B, R, C], dims = [0, 2, 1], out)`.
pub fn transpose<T: Element>(
    ordinal: u32,
    _stream: &Stream,
    _out: &mut BufferViewMut<'_, T>,
    _x: &BufferView<'_, T>,
    _d: TransposeDims,
) -> Result<()> {
    Err(npu_pending("transpose", ordinal, "aclnnPermute"))
}
