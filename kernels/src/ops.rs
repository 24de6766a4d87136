//! Every op on runtime buffers: the public entry points, one per op, each the one dispatch
//! point of its op.
//!
//! Each function checks that its operands live on `stream`'s device and runs the op on the
//! backend of that device ([`crate::backend::select`]): on the CPU the slice-level kernel on
//! the buffers' host slices (bit-identical to calling it directly), on an NPU the op's aclnn
//! body, on the meta device nothing after the op's checks. Shapes, conventions and errors are
//! the slice-level op's; the slice-level function each entry point names documents them.
//!
//! The entry points are written in their op's folder (`<op>/device.rs`, beside the op's
//! `host.rs` and `npu.rs`); this module gathers them under one name.

pub use crate::adamw::device::adamw_step;
pub use crate::attention::device::{
    attention_backward, attention_block_backward, attention_block_forward, attention_forward,
};
pub use crate::cast::device::cast;
pub use crate::cross_entropy::device::{
    cross_entropy, cross_entropy_in_place, cross_entropy_lm_head,
};
pub use crate::elementwise::device::{add_into, mul, mul_into};
pub use crate::embedding::device::{embedding_backward, embedding_forward};
pub use crate::gelu::device::{gelu_backward, gelu_forward};
pub use crate::gemm::device::gemm;
pub use crate::grad_clip::device::{
    clip_grad_norm, clip_with_sum_squares, grad_sum_squares, scale_grads,
};
pub use crate::index::device::{gather_rows, scatter_add_rows, scatter_rows, transpose, zero_rows};
pub use crate::linear::device::{linear_backward, linear_forward};
pub use crate::patch_embed::device::{patch_embed_backward, patch_embed_forward};
pub use crate::rmsnorm::device::{rmsnorm_backward, rmsnorm_forward};
pub use crate::rope::device::{rope_backward, rope_forward};
pub use crate::swiglu::device::{swiglu_backward, swiglu_forward};

/// The CPU arm of every entry point alone: the buffers' host slices passed to the
/// slice-level function, skipping the entry's check and device selection. What the CPU
/// refuses by itself; tests compare it with the entry points.
pub mod on_cpu {
    pub use crate::adamw::device::on_cpu::adamw_step;
    pub use crate::attention::device::on_cpu::{
        attention_backward, attention_block_backward, attention_block_forward, attention_forward,
    };
    pub use crate::cast::device::on_cpu::cast;
    pub use crate::cross_entropy::device::on_cpu::{
        cross_entropy, cross_entropy_in_place, cross_entropy_lm_head,
    };
    pub use crate::elementwise::device::on_cpu::{add_into, mul, mul_into};
    pub use crate::embedding::device::on_cpu::{embedding_backward, embedding_forward};
    pub use crate::gelu::device::on_cpu::{gelu_backward, gelu_forward};
    pub use crate::gemm::device::on_cpu::gemm;
    pub use crate::grad_clip::device::on_cpu::{grad_sum_squares, scale_grads};
    pub use crate::index::device::on_cpu::{
        gather_rows, scatter_add_rows, scatter_rows, transpose, zero_rows,
    };
    pub use crate::linear::device::on_cpu::{linear_backward, linear_forward};
    pub use crate::patch_embed::device::on_cpu::{patch_embed_backward, patch_embed_forward};
    pub use crate::rmsnorm::device::on_cpu::{rmsnorm_backward, rmsnorm_forward};
    pub use crate::rope::device::on_cpu::{rope_backward, rope_forward};
    pub use crate::swiglu::device::on_cpu::{swiglu_backward, swiglu_forward};
}
