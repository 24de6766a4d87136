//! cannon-kernels: every op of the trainer as a forward + backward pair, on the CPU and on
//! Ascend NPUs.
//!
//! One directory per op (as dfdx does): `mod.rs` holds the slice-level API, its shapes and
//! checks; `cpu.rs` the CPU kernel (fast: threaded with rayon, vectorised, cache-blocked);
//! `device.rs` the same calls over runtime buffers, dispatched by [`device::backend`] to the CPU
//! kernel on host slices or to `npu.rs`, the NPU entry points naming the aclnn calls they make
//! (their bodies land with the NPU issue; until then they return a typed `NotCompiled` /
//! `Unsupported` error, never a host fallback); `tests.rs` the checks against a naive float64
//! implementation written for clarity, plus finite differences on tiny shapes.
//!
//! Conventions (llm.c): backward *accumulates* into gradient buffers (`dW += ...`), so callers
//! zero them once per step (exceptions, documented per op: attention overwrites dq/dk/dv, RoPE's
//! backward rotates in place, cross-entropy writes d_logits); shapes are given in comments with B = batch, T = tokens,
//! D = hidden, H = heads, Hd = head_dim, V = vocab.

pub mod device;
pub mod error;
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
pub mod embedding;
pub mod gelu;
pub mod gemm;
pub mod grad_clip;
pub mod linear;
pub mod patch_embed;
pub mod rmsnorm;
pub mod rope;
pub mod swiglu;

pub use error::{KernelError, Result};
