//! The relative-L2 bars DESIGN.md holds every tensor to ("Numbers we hold ourselves to"), per
//! storage type. This is the one copy: the kernel tests read it, and `cannon verify` (in
//! cannon-trainer, which re-exports it) applies it to the whole model. It lives here, the
//! lowest crate that compares numbers, so that no crate keeps a second copy that could drift.
//!
//! The measure is `||a - r|| / max(||r||, 1e-10)` against a float64 reference.

/// Relative L2 bars for one storage type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerances {
    /// Forward outputs (activations, logits, the loss).
    pub forward: f64,
    /// Gradients (and gradient norms).
    pub grad: f64,
    /// Parameters after optimizer steps, and the losses along the way.
    pub trained: f64,
}

impl Tolerances {
    /// f32 storage: f32 rounding of O(D)-term sums stays near 1e-7 relative, far inside.
    pub const F32: Tolerances = Tolerances {
        forward: 1e-5,
        grad: 1e-4,
        trained: 1e-4,
    };

    /// bf16 storage (the NPU acceptance numbers): one bf16 rounding is 2^-9 ~ 0.002 relative
    /// per element, and a few of them compound through a layer.
    pub const BF16: Tolerances = Tolerances {
        forward: 0.015,
        grad: 0.04,
        trained: 0.04,
    };
}
