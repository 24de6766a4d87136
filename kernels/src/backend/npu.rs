//! [`Backend`] on an Ascend NPU: each method is the op's aclnn body in the op's own `npu.rs`
//! (the op list names it), called with the NPU's ordinal, the stream and the method's
//! arguments. Without `--features npu` every body is the typed `NotCompiled` error.

use super::op_list::{for_each_op, impl_npu_backend};
use super::{Backend, Npu};
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

for_each_op!(impl_npu_backend);
