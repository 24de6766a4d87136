//! Element types of activations, and the f32 <-> bf16 casts.
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
//! [`Elem`] is the storage type the elementwise ops are generic over: `f32`, or `bf16` with
//! every computation done in f32 and one rounding on store.

mod cpu;
pub(crate) mod npu;
pub(crate) mod simd;

#[cfg(test)]
pub(crate) mod check;
#[cfg(test)]
mod tests;

use crate::error::{check_len, Result};
use half::bf16;

/// A storage type for activations: values are widened to f32 for arithmetic and rounded back
/// (to nearest, ties to even) on store.
pub trait Elem: Copy + Default + Send + Sync + 'static + sealed::Sealed {
    /// `"f32"` or `"bf16"`, for error messages and benchmark names.
    const NAME: &'static str;
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
    /// The values as f32 when the type is f32 (entry points generic over the storage type
    /// use it to reach the f32-only kernels; `None` for bf16).
    fn as_f32(s: &[Self]) -> Option<&[f32]>;
    /// Mutable [`Elem::as_f32`].
    fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]>;
    /// The values as bf16 when the type is bf16 (`None` for f32).
    fn as_bf16_mut(s: &mut [Self]) -> Option<&mut [bf16]>;
}

impl Elem for f32 {
    const NAME: &'static str = "f32";
    fn as_f32(s: &[f32]) -> Option<&[f32]> {
        Some(s)
    }
    fn as_f32_mut(s: &mut [f32]) -> Option<&mut [f32]> {
        Some(s)
    }
    fn as_bf16_mut(_: &mut [f32]) -> Option<&mut [bf16]> {
        None
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Elem for bf16 {
    const NAME: &'static str = "bf16";
    fn as_f32(_: &[bf16]) -> Option<&[f32]> {
        None
    }
    fn as_f32_mut(_: &mut [bf16]) -> Option<&mut [f32]> {
        None
    }
    fn as_bf16_mut(s: &mut [bf16]) -> Option<&mut [bf16]> {
        Some(s)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f32_to_bf16(x)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
}

/// Rounds one f32 to bf16 (nearest, ties to even; NaN stays NaN). Branch-free so that loops
/// calling it vectorise, unlike `half::bf16::from_f32`, which gives the same bits.
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> bf16 {
    let b = x.to_bits();
    // Adding 0x7FFF plus the lowest kept bit carries into the kept half exactly when the
    // dropped half is above the midpoint, or at it with an odd kept half.
    let rounded = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16;
    let quiet_nan = (b >> 16) | 0x0040;
    let is_nan = (b & 0x7FFF_FFFF) > 0x7F80_0000;
    bf16::from_bits(if is_nan { quiet_nan } else { rounded } as u16)
}

/// `x` rounded to the nearest value of `E` and widened back: the identity for f32, the bf16
/// rounding for bf16. Used where transformers rounds an intermediate to the activation dtype.
#[inline(always)]
pub fn round_to<E: Elem>(x: f32) -> f32 {
    E::from_f32(x).to_f32()
}

/// `dst[i] = bf16(src[i])`. src, dst: `[N]`.
pub fn cast_f32_to_bf16(src: &[f32], dst: &mut [bf16]) -> Result<()> {
    check_len("cast_f32_to_bf16", "dst", dst.len(), src.len())?;
    cpu::convert(src, dst);
    Ok(())
}

/// `dst[i] = f32(src[i])` (exact). src, dst: `[N]`.
pub fn cast_bf16_to_f32(src: &[bf16], dst: &mut [f32]) -> Result<()> {
    check_len("cast_bf16_to_f32", "dst", dst.len(), src.len())?;
    cpu::convert(src, dst);
    Ok(())
}

/// Converts between any two storage types (f32 -> f32 is a parallel copy). src, dst: `[N]`.
pub fn cast<A: Elem, B: Elem>(src: &[A], dst: &mut [B]) -> Result<()> {
    check_len("cast", "dst", dst.len(), src.len())?;
    cpu::convert(src, dst);
    Ok(())
}
