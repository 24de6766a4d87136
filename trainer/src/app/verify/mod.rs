//! Parity of the Mistral3 model against an eager float64 reference fixture
//! (shared/reference/make_reference.py), as `cannon verify` runs it: forward outputs, every
//! gradient, K AdamW steps, and the multi-image independence property, one [`Row`] per
//! compared tensor.
//!
//! - `fixture`: reading `reference.safetensors` (tensors and metadata) into a [`Reference`].
//! - `measure`: the measure (relative L2 `||a - r|| / max(||r||, 1e-10)` per tensor, NaN
//!   kept).
//! - `checks`: the [`Tolerances`] table and the independence check.
//! - `report`: the rows and the printed table.
//!
//! The tolerances are DESIGN.md's per dtype ([`Tolerances::F32`], [`Tolerances::BF16`]):
//! forward outputs are held to `forward`, gradients and grad norms to `grad`, the training
//! losses and trained parameters to `trained`. Independence is exact.

pub(crate) mod checks;
pub(crate) mod fixture;
pub(crate) mod measure;
pub(crate) mod report;

pub use checks::{tolerances_for, Tolerances};
pub use fixture::Reference;
pub use measure::{distance, Distance};
pub use report::{Report, Row};

use crate::model::{ActElem, Mistral3, ModelError, ParamLayout, Part, Precision, StepMemory};
use crate::parallel::fsdp::{FsdpError, FsdpRank, FsdpSettings, ShardSource};
use cannon_kernels::{KernelError, Tensor};
use cannon_runtime::comm::Communicator;
use std::path::PathBuf;

impl From<KernelError> for VerifyError {
    fn from(e: KernelError) -> Self {
        VerifyError::Model(ModelError::Kernel(e))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Step(#[from] FsdpError),
    #[error("{path}: {reason}")]
    Reference { path: PathBuf, reason: String },
    #[error("{0}")]
    Unusable(String),
}

/// Runs every comparison of `model` (f32 master weights) against `r` at precision `prec`
/// (see `model::precision` for what a bf16 run rounds), with `steps` AdamW steps (default: the
/// fixture's; more than the fixture holds is unusable).
pub fn verify(
    model: &Mistral3,
    r: &Reference,
    prec: Precision,
    steps: Option<usize>,
) -> Result<Report, VerifyError> {
    match prec {
        Precision::F32 => verify_as::<f32>(model, r, steps),
        Precision::Bf16 => verify_as::<half::bf16>(model, r, steps),
    }
}

fn verify_as<A: ActElem>(
    model: &Mistral3,
    r: &Reference,
    steps: Option<usize>,
) -> Result<Report, VerifyError> {
    let tol = tolerances_for(A::PRECISION);
    let batch = r.batch()?;
    let mut report = Report::default();

    let st = model.exec.stream();
    let host = |t: &Tensor<f32>| t.to_host(st).map_err(ModelError::from);

    // Forward, then backward with everything trainable and the pixel gradient, as the
    // fixture computed; the allocator's peaks are reset once the gradients exist, so the
    // report's figures are the step's.
    let mut grads = model.grads(&[Part::Vision, Part::Projector, Part::Text])?;
    let want_pix = !batch.images.is_empty();
    let mut dpix = model.exec.zeros(&[batch.images.pixel_values.len()])?;
    let alloc = model.exec.allocator();
    alloc.reset_peak();
    let start_allocated = alloc.stats().allocated;
    let acts = model.forward::<A>(&batch)?;
    if let (Some(v), Some(feats)) = (&acts.vision, acts.image_features()) {
        let (shape, want) = r.get("out.vision_last_hidden")?;
        let ours = host(v.output())?;
        report.compare("out.vision_last_hidden", shape, &ours, want, tol.forward);
        let (shape, want) = r.get("out.image_features")?;
        let ours = host(feats)?;
        report.compare("out.image_features", shape, &ours, want, tol.forward);
    }
    let (shape, want) = r.get("out.logits")?;
    match acts.logits() {
        Some(logits) => report.compare("out.logits", shape, &host(logits)?, want, tol.forward),
        None => report
            .notes
            .push("chunked loss: logits never materialised, not compared".into()),
    }
    let (shape, want) = r.get("out.loss")?;
    report.compare("out.loss", shape, &[acts.loss() as f32], want, tol.forward);

    model.backward(&batch, &acts, &mut grads, want_pix.then_some(&mut dpix))?;
    drop(acts);
    let stats = alloc.stats();
    report.memory = Some(StepMemory {
        start_allocated,
        max_allocated: stats.peak_allocated,
        max_reserved: stats.peak_reserved,
    });
    let layout = &model.params.layout;
    for (name, (shape, want)) in r.tensors.iter() {
        let Some(param) = name.strip_prefix("grad.") else {
            continue;
        };
        if param == "pixel_values" {
            // Ours is unpadded per image; the fixture's is [N, C, H, W] padded.
            let dpix = host(&dpix)?;
            let (dpix, _) = batch.images.to_padded(&dpix).map_err(ModelError::from)?;
            report.compare(name, shape, &dpix, want, tol.grad);
            continue;
        }
        let ours = grads.get(layout, param).ok_or_else(|| {
            VerifyError::Unusable(format!("reference gradient {name} names no parameter"))
        })?;
        let ours = ours.clone_dtoh(st).map_err(ModelError::from)?;
        report.compare(name, shape, &ours, want, tol.grad);
    }
    drop((grads, dpix));

    checks::independence::<A>(model, &batch, &mut report)?;

    // K AdamW steps with the fixture's settings and frozen parts, through the training step.
    let (settings, fixture_steps) = r.train_settings(model)?;
    let steps = steps.unwrap_or(fixture_steps);
    if steps > fixture_steps {
        return Err(VerifyError::Unusable(format!(
            "--steps {steps}: the fixture holds {fixture_steps} steps"
        )));
    }
    // The training run's own step: a world of one, its shards the model's whole groups.
    let host_groups = model.params.to_host(st)?;
    let mut fsdp = FsdpSettings::from_train(&settings);
    fsdp.loss_mode = model.loss_mode;
    fsdp.memory = model.memory;
    let comm = Communicator::solo(model.exec.device(), std::time::Duration::from_secs(600));
    let source = ShardSource::Full(&host_groups);
    let mut rank = FsdpRank::new(comm, model.exec.clone(), model.cfg.clone(), source, fsdp)?;
    drop(host_groups);
    let (mut losses, mut grad_norms) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let s = rank.step::<A>(std::slice::from_ref(&batch), settings.adamw.lr)?;
        losses.push(s.loss);
        grad_norms.push(s.grad_norm);
    }
    if steps > 0 {
        let as_f32 = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<_>>();
        let first = |name: &str| -> Result<&[f64], VerifyError> {
            let (_, want) = r.get(name)?;
            want.get(..steps).ok_or_else(|| {
                VerifyError::Unusable(format!("{name} holds {} steps, not {steps}", want.len()))
            })
        };
        let want = first("train.loss")?;
        let ours = as_f32(&losses);
        report.compare("train.loss", &[steps], &ours, want, tol.trained);
        let want = first("train.grad_norm")?;
        let ours = as_f32(&grad_norms);
        report.compare("train.grad_norm", &[steps], &ours, want, tol.grad);
    }
    if steps == fixture_steps {
        // One group at a time, as the final model is written: the ranks' shards gathered,
        // its tensors compared, dropped.
        let mut wanted: std::collections::HashMap<&str, (&Vec<usize>, &Vec<f64>)> = r
            .tensors
            .iter()
            .filter_map(|(name, (shape, want))| {
                name.strip_prefix("train.final.")
                    .map(|p| (p, (shape, want)))
            })
            .collect();
        let layout = ParamLayout::new(&model.cfg);
        for (g, group) in layout.groups.iter().enumerate() {
            let full = rank
                .gather_group(g)?
                .to_host(st)
                .map_err(ModelError::from)?;
            for slot in &group.slots {
                if let Some((shape, want)) = wanted.remove(slot.name.as_str()) {
                    let name = format!("train.final.{}", slot.name);
                    report.compare(&name, shape, &full[slot.range()], want, tol.trained);
                }
            }
        }
        if let Some(name) = wanted.keys().next() {
            return Err(VerifyError::Unusable(format!(
                "reference tensor train.final.{name} names no parameter"
            )));
        }
    } else {
        report.notes.push(format!(
            "{steps} of the fixture's {fixture_steps} steps run: trained parameters not compared"
        ));
    }
    Ok(report)
}
