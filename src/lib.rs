//! cannon: a Rust kernel and runtime library over Huawei CANN (AscendCL, aclnn, HCCL), and on it
//! a hand-written Mistral3 (Pixtral vision encoder + projector + Mistral LM) trainer: forward,
//! backward and AdamW on the CPU or, in a build with the `npu` feature, on Ascend NPUs.
//!
//! This facade re-exports the layers; each can also be used on its own:
//!
//! | crate | what exists |
//! |---|---|
//! | [`sys`] | raw FFI to AscendCL / aclnn / HCCL, dlopened at run time |
//! | [`runtime`] | devices (CPU, NPU, and the storage-less meta device), streams, events, buffers, the caching allocator with its statistics, communicators (in-process CPU ranks, HCCL) |
//! | [`kernels`] | every op's forward and backward, with a CPU kernel and an aclnn body each, behind the one dispatch point `kernels::ops` |
//! | [`trainer`] | the Mistral3 model, HF config and weight loading, the data pipeline, `cannon train` with FSDP-style sharding, context parallelism (Ulysses, Ring, hybrid) and the memory features, sharded checkpoints with resume and HF export, `cannon plan`, and the `cannon` binary |
//!
//! The `npu` feature turns on the NPU paths of every layer; CANN's libraries are opened at run
//! time, so an `npu` build links on any machine. `cannon doctor` reports whether the running
//! binary has them and which CPU features it detects.

pub use cannon_kernels as kernels;
pub use cannon_runtime as runtime;
pub use cannon_sys as sys;
pub use cannon_trainer as trainer;
