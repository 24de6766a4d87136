//! Random initialisation of a model that starts from no checkpoint, as transformers'
//! `_init_weights` does for Mistral3: every linear and embedding weight drawn from
//! `N(0, initializer_range^2)` (0.02 in every Mistral config), every RMSNorm weight 1.
//!
//! Every element's value is a function of the seed and its *global index* alone (its offset
//! in the model's groups laid end to end): element `k` takes draws `2k` and `2k + 1` of the
//! seed's SplitMix64 stream, reached in O(1) ([`SplitMix64::at`]). A rank of a sharded run
//! draws only its own elements ([`random_range`]), and the same seed gives bit-identical
//! weights with 1, 2, 4 or 8 ranks, on any machine, in any thread order.

use super::params::{ParamLayout, Params};
use super::ModelError;
use cannon_kernels::device_ctx::DeviceCtx;
use cannon_runtime::rng::SplitMix64;
use rayon::prelude::*;
use std::ops::Range;

/// transformers' `initializer_range` default for Mistral and Pixtral.
pub const INITIALIZER_RANGE: f64 = 0.02;

/// True for the RMSNorm weights (initialised to 1, not drawn).
pub fn is_norm(name: &str) -> bool {
    name.contains("norm") || name.contains("ln_pre")
}

/// The standard normal draw of global element `index` (Box-Muller on draws `2 index` and
/// `2 index + 1` of the seed's stream; the second Box-Muller value is discarded).
fn normal_at(seed: u64, index: u64) -> f64 {
    let mut rng = SplitMix64::at(seed, index.wrapping_mul(2));
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

/// Elements per parallel task (large enough that a task outweighs its scheduling).
const CHUNK: usize = 1 << 16;

/// Elements `range` of group `g` of `layout` (norms 1, everything else drawn as `init`
/// says), as [`random_host`] would give them: what a rank draws for its shard. A range past
/// the group's end is an error (the caller pads).
pub fn random_range(
    layout: &ParamLayout,
    g: usize,
    range: Range<usize>,
    seed: u64,
    init: Init,
) -> Result<Vec<f32>, ModelError> {
    let mut out = vec![0.0f32; range.len()];
    random_range_into(layout, g, range, seed, init, &mut out)?;
    Ok(out)
}

/// [`random_range`] into `out` (of the range's length).
pub fn random_range_into(
    layout: &ParamLayout,
    g: usize,
    range: Range<usize>,
    seed: u64,
    init: Init,
    out: &mut [f32],
) -> Result<(), ModelError> {
    let group = layout.groups.get(g).ok_or_else(|| {
        ModelError::Plan(format!("group {g} of a model of {}", layout.groups.len()))
    })?;
    if range.start > range.end || range.end > group.len || out.len() != range.len() {
        return Err(ModelError::Plan(format!(
            "elements {range:?} of group {g} ({} elements) into {} values",
            group.len,
            out.len()
        )));
    }
    fill_range(layout, g, range, seed, init, out);
    Ok(())
}

/// [`random_range`] into `out` (`range.len()` values) for a range the caller checked.
fn fill_range(
    layout: &ParamLayout,
    g: usize,
    range: Range<usize>,
    seed: u64,
    init: Init,
    out: &mut [f32],
) {
    let base: usize = layout.groups[..g].iter().map(|h| h.len).sum();
    for slot in &layout.groups[g].slots {
        let r = slot.range();
        let (a, b) = (r.start.max(range.start), r.end.min(range.end));
        if a >= b {
            continue;
        }
        let dst = &mut out[a - range.start..b - range.start];
        if is_norm(&slot.name) {
            dst.fill(1.0);
            continue;
        }
        let std = match init {
            Init::Normal(std) => std,
            Init::FanIn if slot.name.contains("embed_tokens") => 1.0,
            Init::FanIn => 1.0 / (slot.shape[1..].iter().product::<usize>().max(1) as f64).sqrt(),
        };
        let first = (base + a) as u64;
        dst.par_chunks_mut(CHUNK).enumerate().for_each(|(c, xs)| {
            let at = first + (c * CHUNK) as u64;
            for (i, x) in xs.iter_mut().enumerate() {
                *x = (normal_at(seed, at + i as u64) * std) as f32;
            }
        });
    }
}

/// Host values of every group of `layout`: norms 1, everything else drawn as `init` says.
/// Holds the whole model: for one process's small models and tests; a sharded run draws its
/// shards with [`random_range`].
pub fn random_host(layout: &ParamLayout, seed: u64, init: Init) -> Vec<Vec<f32>> {
    (0..layout.groups.len())
        .map(|g| {
            let mut out = vec![0.0; layout.groups[g].len];
            fill_range(layout, g, 0..out.len(), seed, init, &mut out);
            out
        })
        .collect()
}

/// Random parameters (see the module docs) uploaded to `exec`'s device.
pub fn random_params(
    exec: &DeviceCtx,
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
    /// are a function of the seed and the index alone.
    #[test]
    fn draws_are_normal_and_reproducible() {
        let n = 20_000;
        let xs: Vec<f64> = (0..n).map(|i| normal_at(3, i)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        // Standard error of the mean is 1/sqrt(n) = 0.007; of the variance sqrt(2/n) = 0.01.
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var - 1.0).abs() < 0.04, "variance {var}");
        assert_eq!(normal_at(9, 17), normal_at(9, 17));
        assert_ne!(normal_at(9, 17), normal_at(10, 17));
        // Element k is the Box-Muller pair of draws 2k, 2k + 1 of the sequential stream.
        let mut walk = SplitMix64::new(5);
        for k in 0..4 {
            let u1 = 1.0 - walk.unit_f64();
            let u2 = walk.unit_f64();
            let want = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            assert_eq!(normal_at(5, k).to_bits(), want.to_bits(), "element {k}");
        }
    }

    /// What a rank draws for its range is bit for bit the same elements of the whole
    /// model's draw, whatever the world size cutting the groups.
    #[test]
    fn ranges_are_the_whole_draw_cut_for_any_world_size() {
        let layout = ParamLayout::new(&crate::model::config::tiny_config());
        for init in [Init::FanIn, Init::Normal(INITIALIZER_RANGE)] {
            let whole = random_host(&layout, 7, init);
            for world in [1usize, 2, 3, 4, 8] {
                for (g, full) in whole.iter().enumerate() {
                    let shard = full.len().div_ceil(world);
                    for r in 0..world {
                        let a = (r * shard).min(full.len());
                        let b = ((r + 1) * shard).min(full.len());
                        let got = random_range(&layout, g, a..b, 7, init).unwrap();
                        let same = got
                            .iter()
                            .zip(&full[a..b])
                            .all(|(x, y)| x.to_bits() == y.to_bits());
                        assert!(same, "group {g}, rank {r} of {world}");
                    }
                }
            }
            // Norms are 1, everything else drawn: no weight is left at zero.
            for (g, slot) in layout.slots() {
                let w = &whole[g][slot.range()];
                match is_norm(&slot.name) {
                    true => assert!(w.iter().all(|&x| x == 1.0), "{}", slot.name),
                    false => assert!(
                        w.iter().all(|&x| x != 0.0 && x.is_finite()),
                        "{}",
                        slot.name
                    ),
                }
            }
        }
        let g = layout.groups.len() - 1;
        let past = layout.groups[g].len + 1;
        assert!(random_range(&layout, g, 0..past, 7, Init::FanIn).is_err());
        assert!(random_range(&layout, g + 1, 0..1, 7, Init::FanIn).is_err());
    }
}
