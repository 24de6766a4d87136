//! cannon-kernels: every op of the trainer as a forward + backward pair, on the CPU and on
//! Ascend NPUs.
//!
//! One directory per op (as dfdx does): `mod.rs` holds the op's types, shapes and checks;
//! `host.rs` its slice-level API (`<op>::host`, the functions over host slices); `device.rs`
//! its device-level entry points (`<op>::device`, over runtime buffers: the op's one dispatch
//! point); `cpu.rs` the CPU kernel (fast: threaded with rayon, vectorised, cache-blocked);
//! `npu.rs` the op's aclnn body (one aclnn call or a documented composition of bound aclnn
//! ops; where the bindings lack the op, GELU, a typed `Unsupported` error naming it, and
//! `NotCompiled` without `--features npu`; never a host fallback); `tests.rs` the checks
//! against a naive float64 implementation written for clarity, plus finite differences on
//! tiny shapes.
//!
//! Two levels of API:
//! - slice level, each op's `host` module (`rmsnorm::host::rmsnorm_forward(&mut [E], ...)`):
//!   the CPU kernels on host memory;
//! - device level, [`ops`] (`ops::rmsnorm_forward(&Stream, &mut BufferViewMut<E>, ...)`,
//!   written in `rmsnorm/device.rs`): the same calls over runtime buffers. Each runs the op's
//!   check, asks [`backend::select`] which backend runs it (every operand must live on the
//!   stream's device) and matches once on the answer: the slice-level kernel on the buffers'
//!   host slices on the CPU, the op's `npu.rs` on an NPU, nothing on the meta device. The
//!   module docs of [`backend`] say why it is shaped like candle's `CustomOp`.
//!
//! One [`Precision`] (f32 or bf16 products) is taken by the GEMM-based ops (`gemm`, `linear`,
//! `patch_embed`); the other ops are generic over the storage type (f32 or bf16).
//!
//! Conventions (llm.c): backward *accumulates* into gradient buffers (`dW += ...`), so callers
//! zero them once per step (exceptions, documented per op: attention overwrites dq/dk/dv, RoPE's
//! backward rotates in place, cross-entropy writes d_logits); shapes are given in comments with B = batch, T = tokens,
//! D = hidden, H = heads, Hd = head_dim, V = vocab.

pub mod backend;
pub mod device_ctx;
pub mod error;
pub mod ops;
pub mod tensor;
pub mod tolerance;

// Deterministic data and comparison helpers for the unit tests, and (through the `testutil`
// feature, which the crate's own dev-dependency on itself turns on) for its integration
// tests, benches and examples and the facade's tests. Not part of the API: hidden from the
// docs and absent from a normal build.
#[cfg(any(test, feature = "testutil"))]
#[doc(hidden)]
pub mod testutil;

pub mod adamw;
pub mod attention;
pub mod cast;
pub mod cross_entropy;
pub mod elementwise;
pub mod embedding;
pub mod gelu;
pub mod gemm;
pub mod grad_clip;
pub mod index;
pub mod linear;
pub mod patch_embed;
pub mod rmsnorm;
pub mod rope;
pub mod swiglu;

pub use error::{KernelError, Result};
pub use gemm::Precision;
pub use tensor::Tensor;
