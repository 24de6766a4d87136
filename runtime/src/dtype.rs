//! The element types of the project: one [`DType`] enum and one sealed [`Element`] trait for
//! everything a [`DeviceBuffer`](crate::DeviceBuffer) holds, a collective moves or an aclnn
//! tensor describes, and [`Float`] for the storage types of activations (f32 and bf16), whose
//! arithmetic is done in f32.
//!
//! Why one trait, sealed: the runtime hands raw buffers to C (aclnn, HCCL) tagged with
//! `T::DTYPE`, and the in-process communicator reads peers' buffers as the type their agreed
//! `DType` names. Both are only sound if `DTYPE` describes `T`'s exact in-memory
//! representation and no two types share a `DType`. Sealing the trait keeps the set of
//! implementations to the list below, where that holds by construction (each is checked at
//! compile time to have `DTYPE.size_bytes() == size_of::<T>()`), so no downstream impl can
//! break it and the trait itself needs no `unsafe`.

use half::bf16;
use std::fmt;

/// The element types of buffers, collectives and aclnn tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    BF16,
    F64,
    I32,
    I64,
    U32,
    U8,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::BF16,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::U32,
        DType::U8,
    ];

    /// Bytes per element.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::BF16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }

    /// The lowercase name (`"f32"`, `"bf16"`, ...), as torch and safetensors spell it.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U32 => "u32",
            DType::U8 => "u8",
        }
    }

    /// True for the floating-point types (the ones a reduction may average).
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::BF16 | DType::F64)
    }

    /// The `HcclDataType` value (hccl_types.h, cann-api.md §5): INT32=2, FP32=4, INT64=5,
    /// UINT8=7, UINT32=9, FP64=10, BFP16=11.
    pub const fn hccl_code(self) -> u32 {
        match self {
            DType::I32 => 2,
            DType::F32 => 4,
            DType::I64 => 5,
            DType::U8 => 7,
            DType::U32 => 9,
            DType::F64 => 10,
            DType::BF16 => 11,
        }
    }

    /// The `aclDataType` value of aclnn tensors (acl_base.h): ACL_FLOAT=0, ACL_INT32=3,
    /// ACL_UINT8=4, ACL_UINT32=8, ACL_INT64=9, ACL_DOUBLE=11, ACL_BF16=27.
    pub const fn acl_code(self) -> i32 {
        match self {
            DType::F32 => 0,
            DType::I32 => 3,
            DType::U8 => 4,
            DType::U32 => 8,
            DType::I64 => 9,
            DType::F64 => 11,
            DType::BF16 => 27,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

// Our codes are the headers' (checked against the generated bindings at compile time).
#[cfg(feature = "npu")]
const _: () = {
    use cannon_sys::{acl, hccl};
    assert!(DType::I32.hccl_code() == hccl::HCCL_DATA_TYPE_INT32);
    assert!(DType::F32.hccl_code() == hccl::HCCL_DATA_TYPE_FP32);
    assert!(DType::I64.hccl_code() == hccl::HCCL_DATA_TYPE_INT64);
    assert!(DType::U8.hccl_code() == hccl::HCCL_DATA_TYPE_UINT8);
    assert!(DType::U32.hccl_code() == hccl::HCCL_DATA_TYPE_UINT32);
    assert!(DType::F64.hccl_code() == hccl::HCCL_DATA_TYPE_FP64);
    assert!(DType::BF16.hccl_code() == hccl::HCCL_DATA_TYPE_BFP16);
    assert!(DType::F32.acl_code() == acl::ACL_FLOAT);
    assert!(DType::I32.acl_code() == acl::ACL_INT32);
    assert!(DType::U8.acl_code() == acl::ACL_UINT8);
    assert!(DType::U32.acl_code() == acl::ACL_UINT32);
    assert!(DType::I64.acl_code() == acl::ACL_INT64);
    assert!(DType::F64.acl_code() == acl::ACL_DOUBLE);
    assert!(DType::BF16.acl_code() == acl::ACL_BF16);
};

mod sealed {
    pub trait Sealed {}
}

/// A type a [`DeviceBuffer`](crate::DeviceBuffer) can hold and a communicator can move.
///
/// Sealed; implemented for `f32`, `half::bf16`, `f64`, `i32`, `i64`, `u32` and `u8`.
/// `DTYPE` describes `Self`'s exact in-memory representation (see the module doc for why the
/// runtime's unsafe code relies on that), and no two implementations share a `DType`.
pub trait Element:
    bytemuck::Pod + Default + fmt::Debug + Send + Sync + 'static + sealed::Sealed
{
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $dt:expr),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $dt;
        }
        const _: () = assert!(<$t as Element>::DTYPE.size_bytes() == std::mem::size_of::<$t>());
    )*};
}

element! {
    f32 => DType::F32,
    bf16 => DType::BF16,
    f64 => DType::F64,
    i32 => DType::I32,
    i64 => DType::I64,
    u32 => DType::U32,
    u8 => DType::U8,
}

/// A storage type for activations: `f32`, or `bf16` with every computation done in f32 and
/// one rounding (to nearest, ties to even) on store. Sealed through [`Element`].
pub trait Float: Element {
    /// `"f32"` or `"bf16"`, for error messages and benchmark names.
    const NAME: &'static str = Self::DTYPE.name();
    /// The value widened to f32 (exact for both types).
    fn to_f32(self) -> f32;
    /// `x` rounded to the nearest value of `Self` (ties to even; NaN stays NaN).
    fn from_f32(x: f32) -> Self;
    /// The bf16 bit pattern this value contributes to a bf16 product: a bf16 as it is, an f32
    /// rounded to nearest even.
    fn bf16_bits(self) -> u16;
}

impl Float for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn bf16_bits(self) -> u16 {
        f32_to_bf16(self).to_bits()
    }
}

impl Float for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16_to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f32_to_bf16(x)
    }
    #[inline(always)]
    fn bf16_bits(self) -> u16 {
        self.to_bits()
    }
}

/// Rounds one f32 to bf16: nearest, ties to even; values past the largest bf16 become
/// infinity; a NaN stays a NaN (sign and top payload bits kept, quiet bit set). Bit-identical
/// to `half::bf16::from_f32` but branch-free, so loops calling it vectorise.
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

/// Widens a bf16 to f32 (exact: a bf16 is the top half of an f32).
#[inline(always)]
pub fn bf16_to_f32(x: bf16) -> f32 {
    f32::from_bits((x.to_bits() as u32) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_names_and_codes_are_distinct() {
        for (i, a) in DType::ALL.iter().enumerate() {
            assert_eq!(a.to_string(), a.name());
            assert_eq!(a.name(), a.name().to_lowercase());
            for b in &DType::ALL[i + 1..] {
                assert_ne!(a.hccl_code(), b.hccl_code(), "{a} {b}");
                assert_ne!(a.acl_code(), b.acl_code(), "{a} {b}");
                assert_ne!(a.name(), b.name());
            }
        }
        assert_eq!(<bf16 as Element>::DTYPE.size_bytes(), 2);
        assert_eq!(<bf16 as Float>::NAME, "bf16");
        assert_eq!(<f32 as Float>::NAME, "f32");
        assert_eq!(<u8 as Element>::DTYPE.to_string(), "u8");
    }

    /// Bit patterns where rounding is decided: around ties, the bf16 maximum, infinities,
    /// subnormals and NaNs (including payloads that would carry into the exponent).
    fn edge_bits() -> Vec<u32> {
        let mut v = Vec::new();
        for hi in [
            0x0000u32, 0x0001, 0x0080, 0x3F80, 0x3F81, 0x7F7F, 0x7F80, 0x7FC0, 0x7FFF,
        ] {
            for lo in [0x0000u32, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF] {
                for sign in [0, 0x8000_0000u32] {
                    v.push(sign | hi << 16 | lo);
                }
            }
        }
        v
    }

    #[test]
    fn f32_to_bf16_matches_half_bit_for_bit() {
        // Every edge, and a stride through all 2^32 patterns (odd, so all low halves occur).
        let stride = 65_521u64;
        let sampled = (0..(1u64 << 32) / stride).map(|k| (k * stride) as u32);
        for b in edge_bits().into_iter().chain(sampled) {
            let x = f32::from_bits(b);
            let ours = f32_to_bf16(x);
            assert_eq!(ours.to_bits(), bf16::from_f32(x).to_bits(), "{b:#010x}");
            assert_eq!(ours.is_nan(), x.is_nan(), "{b:#010x}: NaN must stay NaN");
        }
    }

    #[test]
    fn float_round_trips() {
        for x in [
            0.0f32,
            -0.0,
            1.0,
            -2.5,
            1.0 + 2f32.powi(-8),
            3.0e38,
            f32::INFINITY,
        ] {
            let b = <bf16 as Float>::from_f32(x);
            assert_eq!(b.to_bits(), bf16::from_f32(x).to_bits(), "{x}");
            assert_eq!(Float::to_f32(b), bf16::from_f32(x).to_f32());
            assert_eq!(x.bf16_bits(), b.to_bits());
            assert_eq!(b.bf16_bits(), b.to_bits());
            assert_eq!(<f32 as Float>::from_f32(x).to_bits(), x.to_bits());
        }
        // Ties go to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)).to_f32(), 1.0);
        assert_eq!(
            f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)).to_f32(),
            1.0 + 2f32.powi(-6)
        );
    }
}
