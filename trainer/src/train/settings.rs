//! What the training step is given besides the model and the batch: [`TrainSettings`]
//! (defined beside the step, [`crate::parallel::fsdp::settings`]) and the memory features of
//! `[train]`.

use crate::model::{LossMode, MemoryFeatures, Recompute};
pub use crate::parallel::fsdp::TrainSettings;

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
