//! cannon: a Rust kernel and runtime library over Huawei CANN (AscendCL, aclnn, HCCL), and on it
//! a hand-written Mistral3 (Pixtral vision encoder + projector + Mistral LM) trainer, which is
//! being built: the model runs forward, backward and AdamW on the CPU today.
//!
//! This facade re-exports the layers; each can also be used on its own:
//!
//! | crate | what exists |
//! |---|---|
//! | [`sys`] | raw FFI to AscendCL / aclnn / HCCL, dlopened at run time |
//! | [`runtime`] | devices, streams, events, buffers, allocator statistics, communicators |
//! | [`kernels`] | every op's forward and backward on the CPU; the NPU entry points name their aclnn calls but return a typed error until their bodies land |
//! | [`trainer`] | the Mistral3 model (CPU), HF config and weight loading, the data pipeline, the AdamW step, and the `cannon` binary (`doctor`, `data`, `verify`) |
//!
//! Not there yet: `cannon train`, sharded (FSDP-style) and context-parallel training, the model
//! on NPUs, checkpoint saving and export.

pub use cannon_kernels as kernels;
pub use cannon_runtime as runtime;
pub use cannon_sys as sys;
pub use cannon_trainer as trainer;

/// Whether this build of the facade was compiled with the `npu` feature.
pub const BUILT_WITH_NPU: bool = cfg!(feature = "npu");

/// The target features the facade was compiled for (from the build script).
pub const TARGET_FEATURES: &str = env!("CANNON_TARGET_FEATURES");
