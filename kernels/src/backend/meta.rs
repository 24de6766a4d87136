//! [`Backend`] on the meta device: every method returns what its op list entry says a meta
//! call gives (by default `Ok` of the return type's default: `()`, a norm of 0) and touches
//! no operand. The dispatch has checked that every operand is on the meta device, and the
//! entry's `check` ran before (the op's rules on lengths, dims, ids and precision, the ones
//! its CPU function and NPU body enforce); the buffers' own views checked every range the
//! caller cut. What a meta step measures is its allocations, not its numbers.

use super::op_list::{for_each_op, impl_meta_backend};
use super::{Backend, Meta};
use crate::adamw::AdamW;
use crate::attention::{BlockAttention, QkvBuf, QkvGradBuf, VarlenAttention};
use crate::cross_entropy::{CeStats, LmHeadGrads, LossNorm};
use crate::error::Result;
use crate::gemm::{Dims, Precision, Trans};
use crate::index::TransposeDims;
use crate::linear::{LinearDims, LinearGradBufs};
use crate::patch_embed::{PatchEmbedGradBufs, PatchGeom};
use crate::rope::RopeTable;
use cannon_runtime::{BufferView, BufferViewMut};
use cannon_runtime::{Element, Float};

/// An entry's meta value: its `meta` block, else `Ok(Default::default())`.
macro_rules! value {
    () => {
        Ok(Default::default())
    };
    ($b:block) => {
        $b
    };
}
pub(crate) use value;

for_each_op!(impl_meta_backend);
