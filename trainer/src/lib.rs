//! cannon-trainer: the Mistral3 model and the `cannon` binary.
//!
//! - [`model`]: Mistral3 (Pixtral + projector + Mistral) forward and backward on the runtime:
//!   parameters, gradients, AdamW state and saved activations are device buffers from the
//!   caching allocator and every op goes through `cannon_kernels::ops`, so the same model
//!   runs on the CPU and, in an `npu` build, on an NPU (each op's aclnn body); read from an HF
//!   `config.json` and safetensors weights; global-norm clipping and AdamW;
//!   [`model::memory`] predicts a step's peak.
//! - [`data`]: the data pipeline (Tekken tokenizer, chat template, Pixtral images, batches).
//! - [`fsdp`]: sharded (ZeRO-3) data-parallel training steps over the runtime's communicator
//!   (in-process CPU ranks, or one process per NPU joined by HCCL).
//! - [`cp`]: context parallelism (Ulysses, Ring, hybrid): a batch's tokens cut over the ranks
//!   of a group, attention still seeing the whole sequence.
//! - [`plan`]: `cannon plan`, each rank's device memory of a run's layout before it runs.
//! - [`bench`](mod@bench): `cannon bench`, timed training steps and the memory and parallel features
//!   each against the run without it.
//! - [`config`]: the TOML run config of `cannon train` and the built-in model presets.
//! - [`train`]: the training run (data loader, gradient accumulation, LR schedule, clipping,
//!   AdamW, metrics, run identity; on one rank or sharded over several) and K optimizer steps
//!   on one batch (what `cannon verify` checks).
//! - [`eval`]: held-out greedy accuracy per question type of the synthetic shapes set.
//! - [`verify`]: parity against an eager float64 reference fixture.
//! - [`batch`]: the one training batch, what the data loader produces and the model takes.
//! - [`checkpoint`]: sharded checkpoints (one safetensors file per rank + a JSON manifest),
//!   written atomically, resumed bit for bit, resharded to another world size, and exported
//!   as an HF checkpoint.
//! - [`cli`]: the `cannon` subcommands: `train`, `eval`, `doctor`, `data`, `verify`, `bench`,
//!   `compare`, `export`, `launch`, `plan`.
//!
//! The guides are in the repository's `docs/` folder (training, parallel, memory, npu, ...).
pub mod batch;
pub mod bench;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod cp;
pub mod data;
pub mod eval;
pub mod fsdp;
pub mod model;
pub mod plan;
pub mod train;
pub mod verify;
