//! Float types of activations, and the f32 <-> bf16 casts.
//!
//! ```text
//! cast_f32_to_bf16(src [N] f32, dst [N] bf16)   round to nearest, ties to even
//! cast_bf16_to_f32(src [N] bf16, dst [N] f32)   exact (bf16 is the top half of an f32)
//! ```
//!
//! Rounding is bit-exact with `half::bf16::from_f32` and with torch's `.to(torch.bfloat16)` on
//! every non-NaN input (ties to even; values past the largest bf16 round to infinity). A NaN
//! stays a NaN: its sign and top payload bits are kept and the quiet bit is set (as `half`
//! does; torch instead writes the canonical `0x7FC0`, which differs only in the NaN payload).
//!
//! [`Float`] is the storage type the elementwise ops are generic over: `f32`, or `bf16` with
//! every computation done in f32 and one rounding on store.

mod cpu;
pub mod device;
pub mod host;
pub(crate) mod npu;
pub(crate) mod simd;

#[cfg(test)]
pub(crate) mod check;
#[cfg(test)]
mod tests;

use crate::error::{check_len, Result};
use cannon_runtime::DType;
use half::bf16;

/// Branch-free f32 -> bf16 rounding (bit-identical to `half`), shared with the runtime.
pub use cannon_runtime::dtype::{bf16_to_f32, f32_to_bf16};
/// The storage types of activations (f32, bf16): the runtime's one float element trait.
/// Values are widened to f32 for arithmetic and rounded back (nearest, ties to even) on store.
pub use cannon_runtime::Float;

/// The values as f32 when `T` is f32 (entry points generic over the storage type use it to
/// reach the f32-only kernels; `None` for bf16).
pub(crate) fn as_f32<T: Float>(s: &[T]) -> Option<&[f32]> {
    (T::DTYPE == DType::F32).then(|| bytemuck::cast_slice(s))
}

/// Mutable [`as_f32`].
pub(crate) fn as_f32_mut<T: Float>(s: &mut [T]) -> Option<&mut [f32]> {
    (T::DTYPE == DType::F32).then(|| bytemuck::cast_slice_mut(s))
}

/// The values as bf16 when `T` is bf16 (`None` for f32).
pub(crate) fn as_bf16_mut<T: Float>(s: &mut [T]) -> Option<&mut [bf16]> {
    (T::DTYPE == DType::BF16).then(|| bytemuck::cast_slice_mut(s))
}

/// `x` rounded to the nearest value of `E` and widened back: the identity for f32, the bf16
/// rounding for bf16. Used where transformers rounds an intermediate to the activation dtype.
#[inline(always)]
pub fn round_to<E: Float>(x: f32) -> f32 {
    E::from_f32(x).to_f32()
}

/// The rule of [`cast`](host::cast) on every backend (the device-level entry point checks it before any
/// backend runs): `dst` as long as `src` (lengths given).
pub(crate) fn check_cast(src: usize, dst: usize) -> Result<()> {
    check_len("cast", "dst", dst, src)
}
