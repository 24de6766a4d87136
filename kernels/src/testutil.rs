//! Deterministic data and comparison helpers shared by the kernel tests and benches.
//!
//! Tests compare a kernel against a naive float64 implementation with the relative L2 error
//! `||a - r|| / max(||r||, 1e-10)`, the measure DESIGN.md fixes for every tensor.

use cannon_runtime::rng::{SplitMix64, GOLDEN_GAMMA};

/// A small deterministic generator over the workspace's SplitMix64 (tests must not depend on a
/// crate's RNG stream changing between versions), with the distributions tests draw from.
#[derive(Clone, Debug)]
pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // The seed is scrambled once so that nearby seeds start apart (as it always was here).
        Rng(SplitMix64::new(seed ^ GOLDEN_GAMMA))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        self.0.unit_f64()
    }

    /// Uniform integer in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        // Rejection rejects with probability n / 2^64: the draws equal the plain modulo ones
        // tests were written with.
        self.0.below(n.max(1) as u64) as usize
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// `n` normal samples scaled by `scale`, as f32.
    pub fn normal_vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() as f32 * scale).collect()
    }
}

/// Relative L2 error `||a - r|| / max(||r||, 1e-10)` of `a` against the reference `r`.
pub fn rel_l2<A: Copy + Into<f64>, R: Copy + Into<f64>>(a: &[A], r: &[R]) -> f64 {
    assert_eq!(a.len(), r.len(), "rel_l2: length mismatch");
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(r) {
        let (x, y) = (x.into(), y.into());
        num += (x - y) * (x - y);
        den += y * y;
    }
    num.sqrt() / den.sqrt().max(1e-10)
}

/// Largest absolute difference between `a` and `r`.
pub fn max_abs<A: Copy + Into<f64>, R: Copy + Into<f64>>(a: &[A], r: &[R]) -> f64 {
    a.iter()
        .zip(r)
        .map(|(&x, &y)| (x.into() - y.into()).abs())
        .fold(0.0, f64::max)
}

/// Widens f32 data to f64 for the naive references.
pub fn to_f64(a: &[f32]) -> Vec<f64> {
    a.iter().map(|&x| x as f64).collect()
}

/// One attention shape of the bench config (`cu` = cumulative sequence ends).
#[derive(Clone, Debug)]
pub struct AttentionShape {
    pub name: &'static str,
    pub cu: Vec<usize>,
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
    pub causal: bool,
}

/// The attention shapes the criterion bench and the `attention_rate` example time: text =
/// 2 sequences x 1024 tokens, 8 q heads x 64, 2 kv heads (GQA 4:1), causal; vision = one
/// 256-patch image, 4 heads x 64, full.
pub fn attention_bench_shapes() -> Vec<AttentionShape> {
    vec![
        AttentionShape {
            name: "text_2x1024_h8_kv2_d64_causal",
            cu: vec![1024, 2048],
            hq: 8,
            hkv: 2,
            d: 64,
            causal: true,
        },
        AttentionShape {
            name: "vision_256_h4_d64_full",
            cu: vec![256],
            hq: 4,
            hkv: 4,
            d: 64,
            causal: false,
        },
    ]
}
