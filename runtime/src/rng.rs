//! SplitMix64, the one deterministic generator of the workspace: the trainer shuffles and draws
//! the synthetic dataset with it, and the runtime's and kernels' tests draw their inputs with
//! it. It lives here, in the lowest crate that uses it, so that every crate above shares one
//! implementation (and one stream: fixtures made with it stay valid).

/// The golden-ratio increment of SplitMix64 (Steele, Lea, Flood 2014).
pub const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64: tiny, good enough for shuffling, synthesis and test data, identical everywhere.
/// Not a cryptographic generator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The whole state: `SplitMix64::new(g.state())` continues exactly where `g` stands
    /// (what a checkpoint stores to resume a stream bit for bit).
    pub fn state(&self) -> u64 {
        self.0
    }

    /// The stream of `seed` after `n` draws, in O(1): SplitMix64's state only moves by
    /// [`GOLDEN_GAMMA`] per draw, so draw `n` of a stream is a pure function of `(seed, n)`.
    /// That makes it a counter-based generator: parallel or sharded callers can each produce
    /// their own part of one stream, with the values the sequential walk would give.
    pub fn at(seed: u64, n: u64) -> Self {
        SplitMix64(seed.wrapping_add(n.wrapping_mul(GOLDEN_GAMMA)))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN_GAMMA);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n, by rejection so that no value is favoured; 0 when n is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let x = self.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }

    /// Uniform in lo..=hi (lo when hi < lo). lo == hi still draws once, as it always has, so
    /// that streams made with it do not shift.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi < lo {
            return lo;
        }
        match (hi - lo).checked_add(1) {
            Some(n) => lo + self.below(n),
            None => self.next_u64(),
        }
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference stream of seed 0 (Vigna's splitmix64.c): the generator must never drift,
    /// or every dataset and fixture drawn with it changes.
    #[test]
    fn matches_the_reference_stream() {
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(r.next_u64(), 0x06c4_5d18_8009_454f);
    }

    #[test]
    fn state_restarts_the_stream() {
        let mut r = SplitMix64::new(3);
        r.next_u64();
        let mut again = SplitMix64::new(r.state());
        assert_eq!(
            (0..5).map(|_| r.next_u64()).collect::<Vec<_>>(),
            (0..5).map(|_| again.next_u64()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn at_is_the_stream_after_n_draws() {
        let mut walk = SplitMix64::new(11);
        for n in 0..50u64 {
            let mut jumped = SplitMix64::at(11, n);
            assert_eq!(jumped.next_u64(), walk.next_u64(), "draw {n}");
        }
    }

    #[test]
    fn below_and_range_stay_in_bounds() {
        let mut r = SplitMix64::new(7);
        for n in [1u64, 2, 3, 10, 1 << 40] {
            assert!((0..100).all(|_| r.below(n) < n));
        }
        assert_eq!(r.below(0), 0);
        assert!((0..100).all(|_| (5..=9).contains(&r.range(5, 9))));
        let (mut a, mut b) = (r.clone(), r.clone());
        assert_eq!(a.range(4, 4), 4);
        b.next_u64();
        assert_eq!(a, b, "range(x, x) draws one value");
        assert_eq!(r.range(9, 4), 9);
        let _ = r.range(0, u64::MAX);
        assert!((0..100).all(|_| (0.0..1.0).contains(&r.unit_f64())));
    }
}
