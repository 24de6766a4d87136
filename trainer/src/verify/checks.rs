//! What `cannon verify` measures: the distance of a tensor from the reference under the
//! tolerance table, and the multi-image independence property.

use super::report::Report;
use super::VerifyError;
use crate::model::{Act, Batch, Images, Mistral3, ModelError, Precision};
use cannon_kernels::Tensor;

/// The relative-L2 bars, one table for the whole project (kept in cannon-kernels, whose tests
/// apply it to every op; re-exported here for the model-level checks).
pub use cannon_kernels::tolerance::Tolerances;

/// The bars a run at activation precision `p` is held to.
pub fn tolerances_for(p: Precision) -> Tolerances {
    match p {
        Precision::F32 => Tolerances::F32,
        Precision::Bf16 => Tolerances::BF16,
    }
}

/// How far a tensor is from its reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Distance {
    /// `||a - r|| / max(||r||, 1e-10)`; infinite when the lengths differ.
    pub rel_l2: f64,
    /// `max |a - r|`.
    pub max_abs: f64,
}

/// `max` that keeps a NaN: `f64::max` returns the other operand, which would turn a NaN
/// weight into a passing `max_abs 0`.
pub fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// The distance of `ours` from the float64 reference `r`. A NaN on either side makes both
/// measures NaN, so the row fails and prints `NaN`.
pub fn distance(ours: &[f32], r: &[f64]) -> Distance {
    let any_nan = ours.iter().any(|x| x.is_nan()) || r.iter().any(|x| x.is_nan());
    if any_nan {
        return Distance {
            rel_l2: f64::NAN,
            max_abs: f64::NAN,
        };
    }
    let (mut num, mut den, mut max_abs) = (0.0f64, 0.0f64, 0.0f64);
    for (&a, &b) in ours.iter().zip(r) {
        let e = a as f64 - b;
        num += e * e;
        den += b * b;
        max_abs = nan_max(max_abs, e.abs());
    }
    let mut rel_l2 = num.sqrt() / den.sqrt().max(1e-10);
    if ours.len() != r.len() {
        rel_l2 = f64::INFINITY;
    } else if !rel_l2.is_finite() {
        // inf - inf on matching infinities is NaN: a NaN difference, reported as such.
        rel_l2 = nan_max(rel_l2, f64::INFINITY);
    }
    Distance { rel_l2, max_abs }
}

/// Multi-image independence on the batch's images: perturbing image j leaves every other
/// image's vision output and image features bit-identical, and the gradient of image j's
/// features reaches no other image's pixels. Adds three exact rows (or a note with fewer
/// than two images).
pub fn independence<A: Act>(
    model: &Mistral3,
    batch: &Batch,
    report: &mut Report,
) -> Result<(), VerifyError> {
    let img = &batch.images;
    if img.len() < 2 {
        report
            .notes
            .push("fewer than 2 images: independence not checked".into());
        return Ok(());
    }
    let cfg = &model.cfg;
    let ex = &model.exec;
    let st = ex.stream();
    let run = |images: &Images| -> Result<_, VerifyError> {
        let v = crate::model::pixtral::forward::<A>(ex, cfg, &model.params, images)?;
        let x = v.output().view();
        let p = crate::model::projector::forward(ex, cfg, &model.params, &v.grid, &x)?;
        Ok((v, p))
    };
    let host = |t: &Tensor<f32>| t.to_host(st).map_err(ModelError::from);
    let (v0, p0) = run(img)?;
    let (out0, feat0) = (host(v0.output())?, host(&p0.out)?);
    let dv = cfg.vision_config.hidden_size;
    let d = cfg.text_config.hidden_size;
    let patch_ends = v0.grid.cu_seqlens.clone();
    let feat_counts = crate::model::projector::tokens_per_image(&v0.grid, cfg.spatial_merge_size);
    let feat_ends: Vec<usize> = feat_counts
        .iter()
        .scan(0, |acc, &n| {
            *acc += n;
            Some(*acc)
        })
        .collect();
    let span = |ends: &[usize], i: usize| (if i == 0 { 0 } else { ends[i - 1] })..ends[i];
    let (mut out_diff, mut feat_diff, mut grad_leak) = (0.0f64, 0.0f64, 0.0f64);
    // Bit equality is the property; a differing pair counts at least 1e-30 so that two
    // values equal as floats but not as bits (0.0 and -0.0) still break it.
    let max_diff = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| {
                if x.to_bits() == y.to_bits() {
                    0.0
                } else {
                    (x - y).abs() as f64 + 1e-30
                }
            })
            .fold(0.0, nan_max)
    };
    for j in 0..img.len() {
        let mut perturbed = img.clone();
        for x in &mut perturbed.pixel_values[img.range(j)] {
            *x = -*x + 0.5;
        }
        let (v1, p1) = run(&perturbed)?;
        let (out1, feat1) = (host(v1.output())?, host(&p1.out)?);
        for i in (0..img.len()).filter(|&i| i != j) {
            let s = span(&patch_ends, i);
            let (a, b) = (
                &out0[s.start * dv..s.end * dv],
                &out1[s.start * dv..s.end * dv],
            );
            out_diff = nan_max(out_diff, max_diff(a, b));
            let s = span(&feat_ends, i);
            feat_diff = nan_max(
                feat_diff,
                max_diff(
                    &feat0[s.start * d..s.end * d],
                    &feat1[s.start * d..s.end * d],
                ),
            );
        }
        // d(sum of image j's features) / d(pixels of the other images) must be exactly 0.
        let mut dfeat = vec![0.0f32; feat0.len()];
        let s = span(&feat_ends, j);
        dfeat[s.start * d..s.end * d].fill(1.0);
        let dfeat = ex
            .upload(&dfeat, p0.out.shape())
            .map_err(ModelError::from)?;
        let mut grads = model.grads(&[])?;
        let mut dpix = ex
            .zeros(&[img.pixel_values.len()])
            .map_err(ModelError::from)?;
        model.backward_images(batch, &v0, &p0, dfeat, &mut grads, Some(&mut dpix))?;
        let dpix = host(&dpix)?;
        for i in (0..img.len()).filter(|&i| i != j) {
            let other = &dpix[img.range(i)];
            let leak = other.iter().map(|x| x.abs() as f64).fold(0.0, nan_max);
            grad_leak = nan_max(grad_leak, leak);
        }
    }
    let shape = [img.len()];
    report.exact("independence.vision_last_hidden", &shape, out_diff);
    report.exact("independence.image_features", &shape, feat_diff);
    report.exact("independence.grad_pixel_values", &shape, grad_leak);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_of_equal_and_close_tensors() {
        let d = distance(&[1.0, -2.0], &[1.0, -2.0]);
        assert_eq!((d.rel_l2, d.max_abs), (0.0, 0.0));
        let d = distance(&[3.0, 4.5], &[3.0, 4.0]);
        assert!((d.rel_l2 - 0.1).abs() < 1e-12, "{d:?}");
        assert_eq!(d.max_abs, 0.5);
    }

    #[test]
    fn nan_anywhere_is_nan_in_both_measures() {
        for (ours, r) in [
            (vec![f32::NAN, 1.0], vec![0.0, 1.0]),
            (vec![1.0, f32::NAN], vec![1.0, 1.0]),
            (vec![1.0, 1.0], vec![1.0, f64::NAN]),
            // Matching infinities differ by NaN.
            (vec![f32::INFINITY], vec![f64::INFINITY]),
        ] {
            let d = distance(&ours, &r);
            assert!(
                d.rel_l2.is_nan() && d.max_abs.is_nan(),
                "{ours:?} {r:?}: {d:?}"
            );
        }
        // f64::max alone would forget the NaN.
        assert!(nan_max(f64::NAN, 0.0).is_nan() && nan_max(0.0, f64::NAN).is_nan());
    }

    #[test]
    fn length_mismatch_is_infinite() {
        let d = distance(&[1.0], &[1.0, 2.0]);
        assert_eq!(d.rel_l2, f64::INFINITY);
    }

    #[test]
    fn precision_picks_its_row_of_the_table() {
        assert_eq!(tolerances_for(Precision::F32), Tolerances::F32);
        assert_eq!(tolerances_for(Precision::Bf16), Tolerances::BF16);
    }
}
