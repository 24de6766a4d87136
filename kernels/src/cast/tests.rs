use super::host::cast;
use super::simd;
use super::*;
use crate::testutil::Rng;

/// Bit patterns that exercise every rounding case: exact halves (ties, even and odd), just
/// above and below, the largest finite values, infinities, zeros, subnormals and NaNs.
fn edge_bits() -> Vec<u32> {
    let mut v = vec![
        0x0000_0000,
        0x8000_0000,
        0x0000_0001,
        0x8000_0001,
        0x0000_8000,
        0x0001_8000,
        0x007F_FFFF,
        0x0080_0000,
        0x3F80_0000,
        0x3F80_8000,
        0x3F81_8000,
        0x3F80_8001,
        0x3F80_7FFF,
        0x3F81_7FFF,
        0x7F7F_FFFF,
        0xFF7F_FFFF,
        0x7F7F_7FFF,
        0x7F7F_8000,
        0x7F80_0000,
        0xFF80_0000,
        0x7F80_0001,
        0xFF80_0001,
        0x7FC0_0000,
        0xFFC0_0000,
        0x7FFF_FFFF,
        0x7F81_2345,
        0xFFA0_0000,
    ];
    for e in [0u32, 1, 100, 127, 200, 254] {
        for m in [0u32, 0x7FFF, 0x8000, 0x8001, 0x1_8000, 0x7F_FFFF] {
            v.push((e << 23) | m);
            v.push(0x8000_0000 | (e << 23) | m);
        }
    }
    v
}

#[test]
fn f32_to_bf16_matches_half_bit_for_bit() {
    // `half::bf16::from_f32` is the reference rounding (ties to even, NaN quieted); it is a
    // different, branchy implementation. Random bit patterns cover every exponent.
    let mut rng = Rng::new(1);
    let mut bits = edge_bits();
    bits.extend((0..1 << 20).map(|_| rng.next_u64() as u32));
    let src: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
    let mut dst = vec![bf16::ZERO; src.len()];
    cast(&src, &mut dst).unwrap();
    for (i, (&x, &y)) in src.iter().zip(&dst).enumerate() {
        let r = bf16::from_f32(x);
        assert_eq!(
            y.to_bits(),
            r.to_bits(),
            "element {i}: {x:e} ({:#010x})",
            bits[i]
        );
        assert_eq!(x.is_nan(), y.is_nan(), "NaN must stay NaN at {i}");
    }
}

#[test]
fn f32_to_bf16_rounds_to_nearest_in_f64() {
    // Independent check of the rounding rule itself: the result is the bf16 nearest to x
    // (computed in f64 from the two neighbours), ties going to the even mantissa.
    let mut rng = Rng::new(2);
    for _ in 0..200_000 {
        let x = (rng.normal() * 10f64.powi(rng.below(60) as i32 - 30)) as f32;
        let y = f32_to_bf16(x);
        let lo = f32::from_bits(x.to_bits() & 0xFFFF_0000);
        let hi = f32::from_bits((x.to_bits() & 0xFFFF_0000) + 0x1_0000);
        let (dlo, dhi) = ((x as f64 - lo as f64).abs(), (hi as f64 - x as f64).abs());
        let expect = if dlo < dhi || (dlo == dhi && (lo.to_bits() >> 16) & 1 == 0) {
            lo
        } else {
            hi
        };
        assert_eq!(y.to_f32().to_bits(), expect.to_bits(), "x = {x:e}");
    }
}

#[test]
fn bf16_to_f32_is_exact_and_round_trips() {
    // Every one of the 65536 bf16 values widens to the f32 whose top half it is (as torch
    // does; `half` would also quiet signalling NaNs) and rounds back to itself (NaN to NaN).
    let src: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
    let mut wide = vec![0.0f32; src.len()];
    cast(&src, &mut wide).unwrap();
    let mut back = vec![bf16::ZERO; src.len()];
    cast(&wide, &mut back).unwrap();
    for i in 0..src.len() {
        assert_eq!(wide[i].to_bits(), (i as u32) << 16, "widen {i:#06x}");
        if src[i].is_nan() {
            assert!(back[i].is_nan());
        } else {
            assert_eq!(back[i].to_bits(), src[i].to_bits(), "round trip {i:#06x}");
        }
    }
}

#[test]
fn generic_cast_and_length_errors() {
    let src = [1.5f32, -2.25, 3.0];
    let mut dst = [0.0f32; 3];
    cast(&src, &mut dst).unwrap();
    assert_eq!(dst, src);
    let mut short = vec![bf16::ZERO; 2];
    let err = cast(&src, &mut short).unwrap_err().to_string();
    assert!(err.contains("dst has 2 elements, expected 3"), "{err}");
}

#[test]
fn simd_exp_is_accurate_to_a_few_ulp() {
    // Against f64 exp over the whole non-clamped range, plus the clamp and NaN behaviour.
    let mut worst = 0.0f64;
    let n = 400_000;
    for i in 0..=n {
        let x = -87.0 + 175.0 * i as f32 / n as f32;
        let r = (x as f64).exp();
        worst = worst.max((simd::exp(x) as f64 - r).abs() / r);
    }
    assert!(
        worst < 3.0 * f32::EPSILON as f64,
        "max relative error {worst:e}"
    );
    assert!(simd::exp(-1000.0) < 1.2e-38 && simd::exp(-1000.0) > 0.0);
    assert!(simd::exp(1000.0).is_finite() && simd::exp(1000.0) > 2e38);
    assert!(simd::exp(f32::NAN).is_nan());
}
