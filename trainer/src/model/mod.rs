//! Mistral3 (Pixtral vision tower + patch-merging projector + Mistral LM), written out by hand
//! in the style of llm.c: parameters in one flat buffer per layer (`params`), activations
//! planned per layer and saved by the forward, and one backward that walks the same steps in
//! reverse.
//!
//! ```text
//! forward                                   backward (reverse order, one function each)
//! pixtral::forward   pixel_values -> [P,Dv]     pixtral::backward   (if vision trains or
//! projector::forward [P,Dv] -> [M,D]            projector::backward  pixel grads are asked)
//! mistral::embed     ids + features -> [T,D]    mistral::embed_backward
//! mistral::forward   [T,D] -> xf [T,D]          mistral::backward
//! head::forward      xf -> logits, loss         head::backward      (full or chunked loss)
//! ```
//!
//! The model lives on a device ([`DeviceCtx`]: a stream and the caching allocator its tensors come
//! from): parameters (one flat f32 tensor per layer group, the master weights), gradients,
//! AdamW moments and every activation the forward saves are `cannon_kernels::Tensor`s, and
//! every op is a `cannon_kernels` device-level op on the model's stream. The host only
//! uploads the batch (ids, labels, positions, pixels, and the index-like data the kernels take
//! as host slices: RoPE tables and slots, cu_seqlens, splice and merge row indices) and reads
//! back the loss. [`memory`] gives the bytes each part saves and the peak of a step, which a
//! test checks against the allocator's figures. `precision` holds the precision policy (`f32`,
//! or bf16 mixed precision with the activations stored as bf16: the type parameter `A: ActElem`).
//! Frozen parts (by default the vision tower and the projector, [`Part`]) have no gradient
//! buffer, and their backward is not run at all unless something below them needs it
//! ([`BackwardSteps`] reports what ran).
//!
//! What each decoder layer keeps for its backward, and where, is the run's
//! [`MemoryFeatures`] (`saved`: recompute, activation offload to a [`cannon_runtime::HostPool`]);
//! [`LossMode`] says whether the logits exist whole or in chunks (`head`).
//!
//! A pass ([`ModelPass`], `pass`) takes each layer group's parameters from a [`ParamSource`] at
//! the point of use and hands each group's gradient to a [`GradSink`] when it is done with
//! it, in the order of [`GroupOrder`] ([`source`]). The model's own [`Params`] and [`Grads`]
//! (`grads`) are the trivial source and sink (views, no copies); a sharded rank
//! (`crate::parallel::fsdp`) gathers and reduce-scatters there.

pub mod batch;
pub(crate) mod block;
pub(crate) mod block_backward;
pub mod config;
pub(crate) mod error;
mod gate;
pub(crate) mod grads;
pub(crate) mod head;
pub mod hf_write;
pub mod init;
pub mod memory;
pub(crate) mod mistral;
pub mod offload;
pub mod optim;
pub(crate) mod params;
pub(crate) mod pass;
pub(crate) mod pixtral;
pub(crate) mod precision;
pub(crate) mod projector;
pub(crate) mod saved;
pub mod source;
pub mod st;
pub(crate) mod streamer;
pub mod weights;

pub use crate::model::batch::{Batch, BatchError, Images};
pub use cannon_kernels::device_ctx::DeviceCtx;
pub use config::{ConfigError, Mistral3Config};
pub use error::{ModelError, WeightsError};
pub use grads::Grads;
pub use head::{Logits, LossMode};
pub use params::{ParamLayout, Params, Part};
pub use pass::{check_batch, BackwardSteps, ForwardActs, ModelPass};
pub use precision::{ActElem, Precision};
pub use saved::{MemoryFeatures, Recompute};
pub use source::{GradSink, GroupOrder, GroupWeights, ParamSource};

use cannon_kernels::cross_entropy::LossNorm;
use cannon_kernels::Tensor;
use cannon_runtime::MemoryStats;
use std::path::Path;

/// The model: its config, its parameters (f32 master copy, on `exec`'s device), how it
/// computes the loss, and where it runs.
#[derive(Debug)]
pub struct Mistral3 {
    pub cfg: Mistral3Config,
    pub params: Params,
    pub loss_mode: LossMode,
    /// What the decoder layers keep for the backward, and where (`saved`).
    pub memory: MemoryFeatures,
    pub exec: DeviceCtx,
}

/// The allocator's figures over one forward + backward (see [`Mistral3::measure_step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepMemory {
    /// Bytes allocated when the step began (parameters, gradients, optimizer state, ...).
    pub start_allocated: usize,
    /// torch's `max_memory_allocated` / `max_memory_reserved` over the step.
    pub max_allocated: usize,
    pub max_reserved: usize,
}

impl Mistral3 {
    /// Reads `dir/config.json` and the checkpoint in `dir` onto the host device.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        Self::load_on(dir, DeviceCtx::cpu())
    }

    /// Reads `dir/config.json` and the checkpoint in `dir` onto `exec`'s device.
    pub fn load_on(dir: &Path, exec: DeviceCtx) -> Result<Self, ModelError> {
        let cfg = Mistral3Config::from_file(&dir.join("config.json"))?;
        let params = weights::load_params(&exec, dir, ParamLayout::new(&cfg))?;
        Ok(Mistral3 {
            cfg,
            params,
            loss_mode: LossMode::Full,
            memory: MemoryFeatures::default(),
            exec,
        })
    }

    /// A copy of the model (parameters copied on the device, same stream and allocator).
    pub fn try_clone(&self) -> Result<Self, ModelError> {
        Ok(Mistral3 {
            cfg: self.cfg.clone(),
            params: self.params.try_clone(self.exec.stream())?,
            loss_mode: self.loss_mode,
            memory: self.memory,
            exec: self.exec.clone(),
        })
    }

    /// Zeroed gradient tensors for the given trainable parts.
    pub fn grads(&self, trainable: &[Part]) -> Result<Grads, ModelError> {
        Grads::new(&self.exec, &self.params.layout, trainable)
    }

    /// Forward + backward of `batch` into `grads` between a reset of the allocator's peaks and
    /// their reading: the step's `max_allocated` / `max_reserved`. Returns the loss too.
    pub fn measure_step<A: ActElem>(
        &self,
        batch: &Batch,
        grads: &mut Grads,
        dpixels: Option<&mut Tensor<f32>>,
    ) -> Result<(f64, StepMemory), ModelError> {
        let alloc = self.exec.allocator();
        alloc.reset_peak();
        let start_allocated = alloc.stats().allocated;
        let acts = self.forward_train::<A>(batch, LossNorm::Mean)?;
        self.backward(batch, &acts, grads, dpixels)?;
        let loss = acts.loss();
        drop(acts);
        let s: MemoryStats = alloc.stats();
        Ok((
            loss,
            StepMemory {
                start_allocated,
                max_allocated: s.peak_allocated,
                max_reserved: s.peak_reserved,
            },
        ))
    }

    /// What the batch alone cannot check: labels inside the vocabulary and as many `[IMG]`
    /// tokens as the images make (before any vision compute is spent on a bad batch).
    pub fn check_batch(&self, batch: &Batch) -> Result<(), ModelError> {
        check_batch(&self.cfg, batch)
    }

    /// The pass over this model's own parameters (the mean loss over the batch's targets).
    pub fn pass(&self) -> ModelPass<'_> {
        ModelPass {
            cfg: &self.cfg,
            exec: &self.exec,
            loss_mode: self.loss_mode,
            memory: self.memory,
            params: &self.params,
            loss_norm: LossNorm::Mean,
            logits: Logits::KeptWithGrad,
            cp: None,
        }
    }

    /// Forward through vision, projector, splice, decoder, lm_head and the mean loss, keeping
    /// the full loss's logits ([`ForwardActs::logits`]).
    pub fn forward<A: ActElem>(&self, batch: &Batch) -> Result<ForwardActs<A>, ModelError> {
        self.pass().forward(batch)
    }

    /// The forward of a training step: the summed loss divided as `norm` says (`Mean`, or
    /// `Divisor(n)` with the trained targets of a whole optimizer step, which makes the
    /// backward of each micro batch its share of that step's mean-loss gradient: gradient
    /// accumulation), and the full loss's logits overwritten by their gradient (one `[T, V]`
    /// tensor instead of two; [`ForwardActs::logits`] is None).
    pub fn forward_train<A: ActElem>(
        &self,
        batch: &Batch,
        norm: LossNorm,
    ) -> Result<ForwardActs<A>, ModelError> {
        ModelPass {
            loss_norm: norm,
            logits: Logits::Grad,
            ..self.pass()
        }
        .forward(batch)
    }

    /// Backward of the mean loss: accumulates into the groups of `grads` that exist and, if
    /// `dpixels` (laid out like `Images::pixel_values`) is given, into its gradient. Parts that
    /// neither train nor lead to something that needs a gradient are not visited.
    pub fn backward<A: ActElem>(
        &self,
        batch: &Batch,
        a: &ForwardActs<A>,
        grads: &mut Grads,
        dpixels: Option<&mut Tensor<f32>>,
    ) -> Result<BackwardSteps, ModelError> {
        self.pass().backward(batch, a, grads, dpixels)
    }

    /// Projector + vision backward from the gradient of the image features `[M, D]`
    /// (consumed).
    pub fn backward_images<A: ActElem>(
        &self,
        batch: &Batch,
        v: &pixtral::PixtralActs<A>,
        p: &projector::ProjectorActs<A>,
        dfeat: Tensor<f32>,
        grads: &mut Grads,
        dpixels: Option<&mut Tensor<f32>>,
    ) -> Result<BackwardSteps, ModelError> {
        self.pass()
            .backward_images(batch, v, p, dfeat, grads, dpixels)
    }
}
