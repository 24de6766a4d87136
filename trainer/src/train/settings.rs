//! What the training step is given besides the model and the batch: the optimizer's
//! hyper-parameters, the clip, the freeze list ([`TrainSettings`]) and the memory features of
//! `[train]`. The step itself is [`crate::parallel::fsdp::FsdpRank::step`], for every world size.

use crate::model::optim::AdamWConfig;
use crate::model::{LossMode, MemoryFeatures, Part, Recompute};

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

/// The model's loss mode and memory features from `[train]` (`loss_chunk`, `recompute`,
/// `offload_activations`, `offload_optimizer`).
pub fn memory_features(t: &crate::train::config::TrainSection) -> (LossMode, MemoryFeatures) {
    let loss = match t.loss_chunk {
        0 => LossMode::Full,
        n => LossMode::Chunked(n),
    };
    let recompute = match t.recompute {
        crate::train::config::RecomputeMode::None => Recompute::None,
        crate::train::config::RecomputeMode::Full => Recompute::Full,
        crate::train::config::RecomputeMode::Selective => Recompute::Selective,
    };
    let mem = MemoryFeatures {
        recompute,
        offload_activations: t.offload_activations,
        offload_optimizer: t.offload_optimizer,
    };
    (loss, mem)
}
