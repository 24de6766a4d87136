//! The training step: forward, backward, `clip_grad_norm_`, AdamW, as torch does it.

use crate::model::optim::{clip_grad_norm, AdamW, AdamWConfig};
use crate::model::{Act, Batch, LossMode, MemoryFeatures, Mistral3, ModelError, Part, Recompute};
use cannon_kernels::cross_entropy::LossNorm;

/// What the optimizer steps need besides the model and the batch (constant learning rate).
#[derive(Debug, Clone, PartialEq)]
pub struct TrainSettings {
    /// torch.optim.AdamW's hyper-parameters; `adamw.lr` is the (constant) learning rate.
    pub adamw: AdamWConfig,
    /// Global L2 norm the gradients are clipped to before each update (`<= 0` or infinite
    /// only measures the norm).
    pub max_grad_norm: f64,
    /// Parts that get neither gradients nor optimizer state.
    pub frozen: Vec<Part>,
}

/// Per-step records of [`train_steps`], one entry per step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepLog {
    /// The loss of the forward pass of each step (before that step's update).
    pub losses: Vec<f64>,
    /// The total gradient norm of each step, before clipping.
    pub grad_norms: Vec<f64>,
}

/// Runs `steps` AdamW steps on `batch`, updating `model` in place: per step, forward at
/// activation precision `A`, backward into zeroed gradients of the parts not frozen, clip to
/// `settings.max_grad_norm`, AdamW update of the f32 master weights. Gradients and the
/// optimizer state live on the model's device; the state starts at zero and lives only for
/// this call.
pub fn train_steps<A: Act>(
    model: &mut Mistral3,
    batch: &Batch,
    settings: &TrainSettings,
    steps: usize,
) -> Result<StepLog, ModelError> {
    let trainable: Vec<Part> = [Part::Vision, Part::Projector, Part::Text]
        .into_iter()
        .filter(|p| !settings.frozen.contains(p))
        .collect();
    let mut grads = model.grads(&trainable)?;
    let mut opt = AdamW::new(&model.exec, settings.adamw, &grads)?;
    let mut log = StepLog::default();
    let exec = model.exec.clone();
    let st = exec.stream();
    for _ in 0..steps {
        let acts = model.forward_train::<A>(batch, LossNorm::Mean)?;
        grads.zero(st)?;
        model.backward(batch, &acts, &mut grads, None)?;
        log.grad_norms
            .push(clip_grad_norm(st, &mut grads, settings.max_grad_norm)?);
        log.losses.push(acts.loss());
        drop(acts);
        opt.update(st, &mut model.params, &grads, settings.adamw.lr)?;
    }
    Ok(log)
}

/// What [`accumulate`] measured over the micro batches of one optimizer step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Accumulated {
    /// Mean loss over every trained target of the step.
    pub loss: f64,
    /// Trained targets of the step (the divisor of every micro batch's summed loss).
    pub targets: usize,
}

/// Forward and backward of the micro batches of one optimizer step into `grads` (which the
/// caller zeroed), each micro batch's summed loss divided by the trained targets of *all* of
/// them, as transformers does with `num_items_in_batch`: the gradients are those of one batch
/// holding every row of every micro batch, whatever their split, and so is the loss. A step
/// whose micro batches hold no trained target adds nothing (loss 0, no target).
pub fn accumulate<A: Act>(
    model: &Mistral3,
    micro: &[Batch],
    grads: &mut crate::model::Grads,
) -> Result<Accumulated, ModelError> {
    let targets: usize = micro
        .iter()
        .map(|b| {
            b.targets()
                .iter()
                .filter(|&&t| t != cannon_kernels::cross_entropy::IGNORE_INDEX)
                .count()
        })
        .sum();
    if targets == 0 {
        return Ok(Accumulated { loss: 0.0, targets });
    }
    let norm = cannon_kernels::cross_entropy::LossNorm::Divisor(targets as f64);
    let mut loss = 0.0;
    for b in micro {
        let acts = model.forward_train::<A>(b, norm)?;
        model.backward(b, &acts, grads, None)?;
        loss += acts.loss();
    }
    Ok(Accumulated { loss, targets })
}

/// The model's loss mode and memory features from `[train]` (`loss_chunk`, `recompute`,
/// `offload_activations`, `offload_optimizer`).
pub fn memory_features(t: &crate::config::TrainSection) -> (LossMode, MemoryFeatures) {
    let loss = match t.loss_chunk {
        0 => LossMode::Full,
        n => LossMode::Chunked(n),
    };
    let recompute = match t.recompute {
        crate::config::RecomputeMode::None => Recompute::None,
        crate::config::RecomputeMode::Full => Recompute::Full,
        crate::config::RecomputeMode::Selective => Recompute::Selective,
    };
    let mem = MemoryFeatures {
        recompute,
        offload_activations: t.offload_activations,
        offload_optimizer: t.offload_optimizer,
    };
    (loss, mem)
}
