//! SIMD plumbing shared by the elementwise ops: run-time dispatch to the widest instruction set
//! of the CPU, and lane-wise helpers written so that LLVM vectorises them.
//!
//! The workspace builds for baseline x86-64 (SSE2), so a plain loop would use 4-wide vectors.
//! [`run`] executes a kernel inside a function compiled for AVX-512 (or AVX2+FMA), chosen at
//! run time by `pulp`. For that to reach the loops, the kernel must be a struct implementing
//! [`pulp::WithSimd`] whose `with_simd` is `#[inline(always)]` and every helper it calls too
//! (closures are not inlined into the target-feature function, which we checked in the
//! generated code: they stay SSE2).
//!
//! Floating-point sums are not reassociated by the compiler, so reductions keep [`LANES`]
//! independent partial sums (`[f32; LANES]`), which it turns into one or two vector registers.

pub(crate) use pulp::{Simd, WithSimd};

/// Independent accumulators per reduction: one AVX-512 register of f32, two of AVX2.
pub(crate) const LANES: usize = 16;

/// Elements per rayon task for flat elementwise work: large enough that the scheduling cost
/// (microseconds) is small against the work, small enough to balance over the cores.
pub(crate) const PAR_CHUNK: usize = 1 << 15;

/// Runs `kernel` compiled for the best instruction set this CPU has.
#[inline]
pub(crate) fn run<K: WithSimd>(kernel: K) -> K::Output {
    pulp::Arch::new().dispatch(kernel)
}

/// Sum of the lanes, pairwise (fixed order, so results do not depend on the machine).
#[inline(always)]
pub(crate) fn hsum(acc: [f32; LANES]) -> f32 {
    let mut v = acc;
    let mut w = LANES / 2;
    while w > 0 {
        for i in 0..w {
            v[i] += v[i + w];
        }
        w /= 2;
    }
    v[0]
}

/// `e^x` in f32, branch-free so it vectorises (Cephes `expf`: range reduction by ln 2 in two
/// parts, degree-6 polynomial on [-ln2/2, ln2/2]). Max relative error about 2 ulp on
/// [-87.3, 88.3]; inputs below clamp to e^-87.3 (1.2e-38, about the smallest normal) rather
/// than 0, inputs above to e^88.3 (2.1e38, finite, so that 2^n below stays representable);
/// NaN propagates.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    // Written as compares (not f32::max/min) so that a NaN input is kept, not replaced.
    let x = if x < -87.33 { -87.33 } else { x };
    let x = if x > 88.3 { 88.3 } else { x };
    // n = round(x / ln 2): adding 1.5 * 2^23 leaves the rounded integer in the low mantissa
    // bits of `t` (and `t - 1.5 * 2^23` is n as a float).
    let t = x * std::f32::consts::LOG2_E + 12_582_912.0;
    let n = t - 12_582_912.0;
    let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let y = p * (r * r) + r + 1.0;
    // 2^n: the integer n (low bits of t's mantissa) plus the exponent bias, shifted into place.
    let two_n = f32::from_bits(t.to_bits().wrapping_sub(0x4B40_0000).wrapping_add(127) << 23);
    y * two_n
}
