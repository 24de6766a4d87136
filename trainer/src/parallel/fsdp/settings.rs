//! What the training step is given besides the model and the batch: the optimizer's
//! hyper-parameters, the clip and the freeze list ([`TrainSettings`]). The step itself is
//! [`super::FsdpRank::step`], for every world size; the train tier fills these from its config.

use crate::model::optim::AdamWConfig;
use crate::model::Part;

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
