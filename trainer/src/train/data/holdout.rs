//! `data.eval_split`: a fraction of the training set held out for validation (LLaMA-Factory's
//! `val_size`). Which samples are held out is a function of the set's usable samples and the
//! seed alone, so the training loader and the validation read the same split in every
//! process, on every resume.

use super::dataset::{DataSet, DatasetStats, Prepared};
use super::shuffle::SplitMix64;
use cannon_kernels::cross_entropy::IGNORE_INDEX;

/// Mixed into the data seed so that the held-out draw is not the first epoch's order.
const HOLDOUT_SALT: u64 = 0x6a09_e667_f3bc_c908;

/// Which of `n` samples are held out for `fraction` (0 < fraction < 1): `round(fraction·n)`
/// of them, at least one and at most `n - 1` (a split that leaves either side empty is no
/// split), drawn by a seeded Fisher-Yates permutation. `fraction <= 0` holds out nothing.
pub fn held_out(n: usize, fraction: f64, seed: u64) -> Vec<bool> {
    let mut held = vec![false; n];
    if fraction <= 0.0 || n < 2 {
        return held;
    }
    let k = ((fraction * n as f64).round() as usize).clamp(1, n - 1);
    let mut rng = SplitMix64::new(seed ^ HOLDOUT_SALT);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    for &i in &order[..k] {
        held[i] = true;
    }
    held
}

impl DataSet {
    /// Splits off the held-out part of the set (see [`held_out`]): `self` keeps the training
    /// samples, the returned set holds the others, both in file order; the counts of
    /// samples, tokens and images move with them. What reading found (bad lines, drops,
    /// truncations) stays with `self`.
    pub fn split_off_holdout(&mut self, fraction: f64, seed: u64) -> DataSet {
        let held = held_out(self.samples.len(), fraction, seed);
        let (out, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.samples)
            .into_iter()
            .zip(held)
            .partition(|(_, h)| *h);
        self.samples = kept.into_iter().map(|(p, _)| p).collect();
        let samples: Vec<_> = out.into_iter().map(|(p, _)| p).collect();
        let stats = counts(&samples);
        let s = &mut self.stats;
        s.samples -= stats.samples;
        s.tokens -= stats.tokens;
        s.label_tokens -= stats.label_tokens;
        s.images -= stats.images;
        DataSet {
            path: self.path.clone(),
            spec: self.spec.clone(),
            layout: self.layout,
            stats,
            samples,
            bad: Vec::new(),
            dropped: Vec::new(),
        }
    }
}

/// The sample, token, trained-token and image counts of `samples`.
fn counts(samples: &[Prepared]) -> DatasetStats {
    DatasetStats {
        samples: samples.len(),
        tokens: samples.iter().map(|p| p.input_ids.len()).sum(),
        label_tokens: samples
            .iter()
            .map(|p| p.labels.iter().filter(|&&l| l != IGNORE_INDEX).count())
            .sum(),
        images: samples.iter().map(|p| p.images.len()).sum(),
        ..DatasetStats::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_is_a_seeded_fraction_that_leaves_both_sides_non_empty() {
        let h = held_out(1000, 0.1, 42);
        assert_eq!(h.iter().filter(|&&x| x).count(), 100);
        assert_eq!(
            h,
            held_out(1000, 0.1, 42),
            "a function of n, fraction and seed"
        );
        assert_ne!(h, held_out(1000, 0.1, 43));
        // Spread over the set, not a block at either end.
        assert!(h[..500].iter().any(|&x| x) && h[500..].iter().any(|&x| x));
        assert_eq!(held_out(10, 0.001, 1).iter().filter(|&&x| x).count(), 1);
        assert_eq!(held_out(10, 0.999, 1).iter().filter(|&&x| x).count(), 9);
        assert!(held_out(1, 0.5, 1).iter().all(|&x| !x));
        assert!(held_out(10, 0.0, 1).iter().all(|&x| !x));
    }
}
