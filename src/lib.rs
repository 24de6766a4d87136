//! cannon: a Rust kernel and runtime library over Huawei CANN (AscendCL, aclnn, HCCL), and on it
//! a hand-written Mistral3 (Pixtral vision encoder + projector + Mistral LM) trainer: forward,
//! backward and AdamW on the CPU or, in a build with the `npu` feature, on Ascend NPUs.
//!
//! This facade re-exports the layers; each can also be used on its own:
//!
//! | crate | what exists |
//! |---|---|
//! | [`sys`] | raw FFI to AscendCL / aclnn / HCCL, dlopened at run time |
//! | [`runtime`] | devices (CPU, NPU, and the storage-less meta device), streams, events, buffers, the caching allocator with its statistics, the host pool offloading goes through, communicators (in-process CPU ranks, HCCL) |
//! | [`kernels`] | every op's forward and backward, one folder per op with its CPU kernel, its aclnn body and its entry point (the op's checks, then one match on the selected backend), all re-exported by `kernels::ops`; `Tensor` and `DeviceCtx` (a stream, an allocator, a host pool) |
//! | [`trainer`] | in four tiers: `model` (Mistral3, HF config and weights, the memory features), `parallel` (FSDP-style sharding, context parallelism: Ulysses, Ring, hybrid), `train` (`cannon train`: config, data pipeline, sharded checkpoints with resume and HF export, evaluation) and `app` (the `cannon` binary's commands, `cannon plan`, `bench`, `verify`) |
//!
//! The `npu` feature turns on the NPU paths of every layer; CANN's libraries are opened at run
//! time, so an `npu` build links on any machine. `cannon doctor` reports whether the running
//! binary has them and which CPU features it detects.

pub use cannon_kernels as kernels;
pub use cannon_runtime as runtime;
pub use cannon_sys as sys;
pub use cannon_trainer as trainer;
