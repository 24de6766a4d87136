//! HCCL data types and reduce ops: sizes, which collective accepts which type (as the CANN
//! docs list them for Atlas A2, the 910B), and the reductions themselves.
//!
//! Support, from the HcclAllReduce / HcclReduce / HcclReduceScatter pages of the CANN 8.x API
//! reference (Atlas A2 training series) and hccl.h's comments:
//! - reductions: int8, int16, int32, int64, fp16, fp32, bf16; `prod` not for int16 or bf16.
//! - data movement (Broadcast, AllGather, Send/Recv, AlltoAll(V)): int8..int64, uint8..uint64,
//!   fp16, fp32, fp64, bf16.
//! - INT128 and the fp8 types exist in the enum but no collective takes them here:
//!   `HCCL_E_NOT_SUPPORT`.
//!
//! Reductions combine ranks in rank order 0, 1, ..., n-1 with fp16/bf16 accumulated in f32 and
//! rounded once, so every rank computes bit-identical results (and the same values as the
//! runtime's CPU communicator). Integer sums wrap.

use crate::error::{EmuError, EmuResult};
use cannon_sys::hccl::*;
use half::{bf16, f16};

fn err(code: HcclResult, message: impl Into<String>) -> EmuError {
    EmuError::new(code as i32, message)
}

/// A data type a collective was called with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DType(pub HcclDataType);

impl DType {
    pub fn name(self) -> &'static str {
        match self.0 {
            HCCL_DATA_TYPE_INT8 => "int8",
            HCCL_DATA_TYPE_INT16 => "int16",
            HCCL_DATA_TYPE_INT32 => "int32",
            HCCL_DATA_TYPE_FP16 => "fp16",
            HCCL_DATA_TYPE_FP32 => "fp32",
            HCCL_DATA_TYPE_INT64 => "int64",
            HCCL_DATA_TYPE_UINT64 => "uint64",
            HCCL_DATA_TYPE_UINT8 => "uint8",
            HCCL_DATA_TYPE_UINT16 => "uint16",
            HCCL_DATA_TYPE_UINT32 => "uint32",
            HCCL_DATA_TYPE_FP64 => "fp64",
            HCCL_DATA_TYPE_BFP16 => "bfp16",
            HCCL_DATA_TYPE_INT128 => "int128",
            HCCL_DATA_TYPE_HIF8 => "hif8",
            HCCL_DATA_TYPE_FP8E4M3 => "fp8e4m3",
            HCCL_DATA_TYPE_FP8E5M2 => "fp8e5m2",
            HCCL_DATA_TYPE_FP8E8M0 => "fp8e8m0",
            _ => "unknown",
        }
    }

    /// Bytes per element of a type a collective accepts for data movement.
    pub fn size(self) -> EmuResult<usize> {
        Ok(match self.0 {
            HCCL_DATA_TYPE_INT8 | HCCL_DATA_TYPE_UINT8 => 1,
            HCCL_DATA_TYPE_INT16
            | HCCL_DATA_TYPE_UINT16
            | HCCL_DATA_TYPE_FP16
            | HCCL_DATA_TYPE_BFP16 => 2,
            HCCL_DATA_TYPE_INT32 | HCCL_DATA_TYPE_UINT32 | HCCL_DATA_TYPE_FP32 => 4,
            HCCL_DATA_TYPE_INT64 | HCCL_DATA_TYPE_UINT64 | HCCL_DATA_TYPE_FP64 => 8,
            HCCL_DATA_TYPE_INT128
            | HCCL_DATA_TYPE_HIF8
            | HCCL_DATA_TYPE_FP8E4M3
            | HCCL_DATA_TYPE_FP8E5M2
            | HCCL_DATA_TYPE_FP8E8M0 => {
                return Err(err(
                    HCCL_E_NOT_SUPPORT,
                    format!(
                        "dataType {} ({}) is not supported by this collective",
                        self.0,
                        self.name()
                    ),
                ))
            }
            other => {
                return Err(err(
                    HCCL_E_PARA,
                    format!("dataType {other} is not an HcclDataType"),
                ))
            }
        })
    }

    /// Checks that a reduction (AllReduce, Reduce, ReduceScatter) takes this type with `op`.
    pub fn check_reduce(self, op: HcclReduceOp) -> EmuResult<()> {
        self.size()?;
        let name = match op {
            HCCL_REDUCE_SUM => "sum",
            HCCL_REDUCE_PROD => "prod",
            HCCL_REDUCE_MAX => "max",
            HCCL_REDUCE_MIN => "min",
            other => {
                return Err(err(
                    HCCL_E_PARA,
                    format!("op {other} is not an HcclReduceOp (sum 0, prod 1, max 2, min 3)"),
                ))
            }
        };
        let reducible = matches!(
            self.0,
            HCCL_DATA_TYPE_INT8
                | HCCL_DATA_TYPE_INT16
                | HCCL_DATA_TYPE_INT32
                | HCCL_DATA_TYPE_INT64
                | HCCL_DATA_TYPE_FP16
                | HCCL_DATA_TYPE_FP32
                | HCCL_DATA_TYPE_BFP16
        );
        if !reducible {
            return Err(err(
                HCCL_E_NOT_SUPPORT,
                format!(
                    "reductions take int8, int16, int32, int64, fp16, fp32, bfp16; not {}",
                    self.name()
                ),
            ));
        }
        if op == HCCL_REDUCE_PROD && matches!(self.0, HCCL_DATA_TYPE_INT16 | HCCL_DATA_TYPE_BFP16) {
            return Err(err(
                HCCL_E_NOT_SUPPORT,
                format!("{name} does not support {} (Atlas A2)", self.name()),
            ));
        }
        Ok(())
    }
}

/// Reduces rank-ordered contributions (`parts[r]`: rank r's bytes, all the same length) into
/// `out`. The caller checked the type and op with [`DType::check_reduce`].
pub fn reduce(dtype: DType, op: HcclReduceOp, parts: &[&[u8]], out: &mut [u8]) -> EmuResult<()> {
    if parts.is_empty() || parts.iter().any(|p| p.len() != out.len()) {
        return Err(err(
            HCCL_E_PARA,
            format!(
                "internal: reducing parts of {:?} bytes into {}",
                parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
                out.len()
            ),
        ));
    }
    macro_rules! native {
        ($t:ty, $add:expr, $mul:expr, $max:expr, $min:expr) => {{
            // Folded into `out` in rank order, element by element: no copy of any part
            // (a gradient's reduce-scatter reduces hundreds of MB).
            const N: usize = std::mem::size_of::<$t>();
            let f: fn($t, $t) -> $t = match op {
                HCCL_REDUCE_SUM => $add,
                HCCL_REDUCE_PROD => $mul,
                HCCL_REDUCE_MAX => $max,
                _ => $min,
            };
            out.copy_from_slice(parts[0]);
            for p in &parts[1..] {
                for (a, b) in out.chunks_exact_mut(N).zip(p.chunks_exact(N)) {
                    f(<$t as Le>::from_le(a), <$t as Le>::from_le(b)).put_le(a);
                }
            }
        }};
    }
    macro_rules! int {
        ($t:ty) => {
            native!(
                $t,
                |a: $t, b: $t| a.wrapping_add(b),
                |a: $t, b: $t| a.wrapping_mul(b),
                |a: $t, b: $t| a.max(b),
                |a: $t, b: $t| a.min(b)
            )
        };
    }
    match dtype.0 {
        HCCL_DATA_TYPE_INT8 => int!(i8),
        HCCL_DATA_TYPE_INT16 => int!(i16),
        HCCL_DATA_TYPE_INT32 => int!(i32),
        HCCL_DATA_TYPE_INT64 => int!(i64),
        HCCL_DATA_TYPE_FP32 => native!(f32, |a, b| a + b, |a, b| a * b, fmax, fmin),
        HCCL_DATA_TYPE_FP16 => half_reduce::<f16>(op, parts, out, f16::to_f32, f16::from_f32),
        HCCL_DATA_TYPE_BFP16 => half_reduce::<bf16>(op, parts, out, bf16::to_f32, bf16::from_f32),
        _ => {
            return Err(err(
                HCCL_E_NOT_SUPPORT,
                format!("no reduction for {}", dtype.name()),
            ))
        }
    }
    Ok(())
}

/// max/min that propagate NaN (a diverged rank must show in the result).
fn fmax(a: f32, b: f32) -> f32 {
    if b.is_nan() || b > a {
        b
    } else {
        a
    }
}

fn fmin(a: f32, b: f32) -> f32 {
    if b.is_nan() || b < a {
        b
    } else {
        a
    }
}

fn half_reduce<H: bits16::Bits16>(
    op: HcclReduceOp,
    parts: &[&[u8]],
    out: &mut [u8],
    to: fn(H) -> f32,
    from: fn(f32) -> H,
) {
    let n = out.len() / 2;
    let mut acc: Vec<f32> = load::<u16>(parts[0], n)
        .into_iter()
        .map(|b| to(H::from_bits(b)))
        .collect();
    for p in &parts[1..] {
        let src = load::<u16>(p, n);
        let f: fn(f32, f32) -> f32 = match op {
            HCCL_REDUCE_SUM => |a, b| a + b,
            HCCL_REDUCE_PROD => |a, b| a * b,
            HCCL_REDUCE_MAX => fmax,
            _ => fmin,
        };
        acc.iter_mut()
            .zip(&src)
            .for_each(|(a, &b)| *a = f(*a, to(H::from_bits(b))));
    }
    let bits: Vec<u16> = acc.into_iter().map(|a| from(a).to_bits()).collect();
    store(&bits, out);
}

/// The two 16-bit float types by their bits.
mod bits16 {
    pub trait Bits16: Copy {
        fn from_bits(b: u16) -> Self;
        fn to_bits(self) -> u16;
    }
    impl Bits16 for half::f16 {
        fn from_bits(b: u16) -> Self {
            half::f16::from_bits(b)
        }
        fn to_bits(self) -> u16 {
            half::f16::to_bits(self)
        }
    }
    impl Bits16 for half::bf16 {
        fn from_bits(b: u16) -> Self {
            half::bf16::from_bits(b)
        }
        fn to_bits(self) -> u16 {
            half::bf16::to_bits(self)
        }
    }
}

/// Plain numbers with a little-endian byte form.
pub trait Le: Copy + Default {
    const N: usize;
    fn from_le(b: &[u8]) -> Self;
    fn put_le(self, b: &mut [u8]);
}

macro_rules! le {
    ($($t:ty),*) => {$(
        impl Le for $t {
            const N: usize = std::mem::size_of::<$t>();
            fn from_le(b: &[u8]) -> Self {
                let mut w = [0u8; std::mem::size_of::<$t>()];
                w.copy_from_slice(b);
                <$t>::from_le_bytes(w)
            }
            fn put_le(self, b: &mut [u8]) {
                b.copy_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
le!(i8, i16, i32, i64, u16, f32);

fn load<T: Le>(b: &[u8], n: usize) -> Vec<T> {
    b.chunks_exact(T::N).take(n).map(T::from_le).collect()
}

fn store<T: Le>(v: &[T], out: &mut [u8]) {
    for (x, dst) in v.iter().zip(out.chunks_exact_mut(T::N)) {
        x.put_le(dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: Le>(v: &[T]) -> Vec<u8> {
        let mut out = vec![0u8; v.len() * T::N];
        store(v, &mut out);
        out
    }

    #[test]
    fn reductions_follow_rank_order_and_types() {
        let a = bytes(&[1i32, -5, i32::MAX]);
        let b = bytes(&[2i32, 7, 1]);
        let mut out = vec![0u8; a.len()];
        reduce(
            DType(HCCL_DATA_TYPE_INT32),
            HCCL_REDUCE_SUM,
            &[&a, &b],
            &mut out,
        )
        .unwrap();
        assert_eq!(load::<i32>(&out, 3), vec![3, 2, i32::MIN], "sums wrap");
        reduce(
            DType(HCCL_DATA_TYPE_INT32),
            HCCL_REDUCE_MIN,
            &[&a, &b],
            &mut out,
        )
        .unwrap();
        assert_eq!(load::<i32>(&out, 3), vec![1, -5, 1]);

        let x = bytes(&[1.5f32, f32::NAN]);
        let y = bytes(&[-2.0f32, 3.0]);
        let mut o = vec![0u8; 8];
        reduce(
            DType(HCCL_DATA_TYPE_FP32),
            HCCL_REDUCE_MAX,
            &[&x, &y],
            &mut o,
        )
        .unwrap();
        let got = load::<f32>(&o, 2);
        assert_eq!(got[0], 1.5);
        assert!(got[1].is_nan(), "max propagates NaN");

        // bf16: 1 + 2^-8 + 2^-8 in f32 is 1 + 2^-7, exactly a bf16; pairwise bf16 rounding
        // would give 1.
        let one = bf16::from_f32(1.0).to_bits();
        let tiny = bf16::from_f32(2f32.powi(-8)).to_bits();
        let (p, q, r) = (bytes(&[one]), bytes(&[tiny]), bytes(&[tiny]));
        let mut o = vec![0u8; 2];
        reduce(
            DType(HCCL_DATA_TYPE_BFP16),
            HCCL_REDUCE_SUM,
            &[&p, &q, &r],
            &mut o,
        )
        .unwrap();
        assert_eq!(
            bf16::from_bits(load::<u16>(&o, 1)[0]).to_f32(),
            1.0 + 2f32.powi(-7)
        );
    }

    #[test]
    fn unsupported_types_and_ops_are_named() {
        let e = DType(HCCL_DATA_TYPE_BFP16)
            .check_reduce(HCCL_REDUCE_PROD)
            .unwrap_err();
        assert_eq!(e.code, HCCL_E_NOT_SUPPORT as i32);
        let e = DType(HCCL_DATA_TYPE_FP64)
            .check_reduce(HCCL_REDUCE_SUM)
            .unwrap_err();
        assert!(e.message.contains("not fp64"), "{e}");
        let e = DType(HCCL_DATA_TYPE_FP32).check_reduce(9).unwrap_err();
        assert_eq!(e.code, HCCL_E_PARA as i32);
        assert_eq!(DType(77).size().unwrap_err().code, HCCL_E_PARA as i32);
        assert_eq!(
            DType(HCCL_DATA_TYPE_INT128).size().unwrap_err().code,
            HCCL_E_NOT_SUPPORT as i32
        );
        DType(HCCL_DATA_TYPE_FP16)
            .check_reduce(HCCL_REDUCE_PROD)
            .unwrap();
    }
}
