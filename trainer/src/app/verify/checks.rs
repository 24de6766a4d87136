//! What `cannon verify` holds the model to: the tolerance table its distances are compared
//! with, and the multi-image independence property.

use super::measure::nan_max;
use super::report::Report;
use super::VerifyError;
use crate::model::{ActElem, Batch, Images, Mistral3, ModelError, Precision};
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

/// Multi-image independence on the batch's images: perturbing image j leaves every other
/// image's vision output and image features bit-identical, and the gradient of image j's
/// features reaches no other image's pixels. Adds three exact rows (or a note with fewer
/// than two images).
pub fn independence<A: ActElem>(
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
    fn precision_picks_its_row_of_the_table() {
        assert_eq!(tolerances_for(Precision::F32), Tolerances::F32);
        assert_eq!(tolerances_for(Precision::Bf16), Tolerances::BF16);
    }
}
