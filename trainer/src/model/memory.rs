//! The memory of a training step: the bytes each part of the model saves for its backward,
//! and the peak of a forward + backward, as formulas over the config and the batch.
