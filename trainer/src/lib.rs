//! cannon-trainer: the Mistral3 model, its parallel training and the `cannon` binary, in four
//! tiers, each importing only the ones below it (the model also calls [`parallel::cp`], its
//! attention seam, which imports nothing above it):
//!
//! - [`model`]: Mistral3 (Pixtral + projector + Mistral) forward and backward on the runtime:
//!   parameters, gradients, AdamW state and saved activations are device buffers from the
//!   caching allocator and every op is a `cannon_kernels` op, so the same model runs on the
//!   CPU and, in an `npu` build, on an NPU; the batch it takes ([`model::batch`]), HF config
//!   and safetensors weights, clipping and AdamW, and [`model::memory`], a step's predicted
//!   peak.
//! - [`parallel`]: sharded (ZeRO-3) data parallelism ([`parallel::fsdp`]) and context
//!   parallelism ([`parallel::cp`]: Ulysses, Ring, hybrid) over the runtime's communicator
//!   (in-process CPU ranks, or one process per NPU joined by HCCL).
//! - [`train`]: the training run: its TOML [`train::config`], the [`train::data`] pipeline,
//!   gradient accumulation, LR schedule, metrics, sharded [`train::checkpoint`]s with resume
//!   and HF export, the held-out [`train::eval`]uation; on one rank or sharded over several.
//! - [`app`]: the `cannon` subcommands ([`app::cli`]) and what only they use: `cannon plan`,
//!   `cannon bench`, `cannon verify`.
//!
//! Beside them, used by every tier: [`bounded`] reads the small files nobody here wrote with
//! their size checked first, and [`durable`] commits files and folders (fsync, rename, fsync).
//!
//! The guides are in the repository's `docs/` folder (training, parallel, memory, npu, ...).
pub mod app;
pub mod bounded;
pub mod durable;
pub mod model;
pub mod parallel;
pub mod train;
