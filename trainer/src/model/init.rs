//! Random initialisation of a model that starts from no checkpoint, as transformers'
//! `_init_weights` does for Mistral3: every linear and embedding weight drawn from
//! `N(0, initializer_range^2)` (0.02 in every Mistral config), every RMSNorm weight 1.
//!
//! The draw is deterministic in the seed and the layout (one SplitMix64 stream walked over the
//! groups in order), so two runs with the same seed start from the same weights on any machine.

use super::exec::Exec;
use super::params::{ParamLayout, Params};
use super::ModelError;
use cannon_runtime::rng::SplitMix64;

/// transformers' `initializer_range` default for Mistral and Pixtral.
pub const INITIALIZER_RANGE: f64 = 0.02;

/// True for the RMSNorm weights (initialised to 1, not drawn).
pub fn is_norm(name: &str) -> bool {
    name.contains("norm") || name.contains("ln_pre")
}

/// One standard normal draw (Box-Muller on two uniform draws; the second value is discarded so
/// that every weight consumes exactly two draws and the stream stays easy to reproduce).
fn normal(rng: &mut SplitMix64) -> f64 {
    // 1 - u keeps the log's argument in (0, 1].
    let u1 = 1.0 - rng.unit_f64();
    let u2 = rng.unit_f64();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// How the spread of the drawn weights is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Every weight `N(0, std^2)` (transformers: `std = initializer_range = 0.02`).
    Normal(f64),
    /// Linear weights `N(0, 1 / fan_in)` (fan_in: the input features of `[out, in]`, or
    /// `C p p` of the patch convolution), embeddings `N(0, 1)`: every layer's output starts
    /// at the scale of its input whatever the width, which a narrow model needs (0.02 is
    /// `1/sqrt(fan_in)` for widths of a few thousand, and shrinks a width-64 model's signals
    /// and gradients several-fold per layer).
    FanIn,
}

/// Host values of every group of `layout`: norms 1, everything else drawn as `init` says.
pub fn random_host(layout: &ParamLayout, seed: u64, init: Init) -> Vec<Vec<f32>> {
    let mut rng = SplitMix64::new(seed);
    let mut host: Vec<Vec<f32>> = layout.groups.iter().map(|g| vec![0.0; g.len]).collect();
    for (g, slot) in layout.slots() {
        let w = &mut host[g][slot.range()];
        if is_norm(&slot.name) {
            w.fill(1.0);
            continue;
        }
        let std = match init {
            Init::Normal(std) => std,
            Init::FanIn if slot.name.contains("embed_tokens") => 1.0,
            Init::FanIn => 1.0 / (slot.shape[1..].iter().product::<usize>().max(1) as f64).sqrt(),
        };
        w.iter_mut()
            .for_each(|x| *x = (normal(&mut rng) * std) as f32);
    }
    host
}

/// Random parameters (see the module docs) uploaded to `exec`'s device.
pub fn random_params(
    exec: &Exec,
    layout: ParamLayout,
    seed: u64,
    init: Init,
) -> Result<Params, ModelError> {
    let host = random_host(&layout, seed, init);
    Params::from_host(exec, layout, &host)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The draws have the asked mean and spread (within 4 standard errors of 20k samples) and
    /// the stream is a function of the seed alone.
    #[test]
    fn draws_are_normal_and_reproducible() {
        let mut rng = SplitMix64::new(3);
        let n = 20_000;
        let xs: Vec<f64> = (0..n).map(|_| normal(&mut rng)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        // Standard error of the mean is 1/sqrt(n) = 0.007; of the variance sqrt(2/n) = 0.01.
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var - 1.0).abs() < 0.04, "variance {var}");
        let mut a = SplitMix64::new(9);
        let mut b = SplitMix64::new(9);
        assert_eq!(normal(&mut a), normal(&mut b));
    }
}
