//! Mistral3 (Pixtral vision tower + patch-merging projector + Mistral LM), written out by hand
//! in the style of llm.c: parameters in one flat buffer per layer ([`params`]), activations
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
//! Every op is a `cannon_kernels` op; [`ops`] holds the precision policy (`f32`, or bf16
//! mixed precision with the activations stored as bf16: the type parameter `A: Act`).
//! Frozen parts (by default the vision tower and the projector, [`Part`]) have no gradient
//! buffer, and their backward is not run at all unless something below them needs it
//! ([`Visited`] reports what ran).

pub mod block;
pub mod config;
pub mod head;
pub mod mistral;
pub mod ops;
pub mod optim;
pub mod params;
pub mod pixtral;
pub mod projector;
pub mod weights;

pub use crate::batch::{Batch, BatchError, Images};
pub use config::{ConfigError, Mistral3Config};
pub use head::LossMode;
pub use ops::{Act, Precision};
pub use params::{Grads, ParamLayout, Params, Part};
pub use weights::WeightsError;

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error(
        "image features and image tokens do not match: {tokens} [IMG] tokens, {features} \
         image feature rows"
    )]
    ImageTokens { tokens: usize, features: usize },
    #[error("bad input: {0}")]
    Input(String),
    #[error("bad batch: {0}")]
    Batch(#[from] BatchError),
    #[error(transparent)]
    Kernel(#[from] cannon_kernels::KernelError),
}

/// What the whole forward saves (activations stored as `A`).
#[derive(Clone, Debug)]
pub struct ForwardActs<A> {
    pub vision: Option<pixtral::PixtralActs<A>>,
    pub projector: Option<projector::ProjectorActs<A>>,
    pub text: mistral::TextActs<A>,
    pub head: head::HeadActs,
    /// `[T]` next-token targets (`IGNORE_INDEX` = ignored).
    pub targets: Vec<i32>,
}

impl<A> ForwardActs<A> {
    /// Projector output `[M, D]` (empty without images).
    pub fn image_features(&self) -> &[f32] {
        self.projector.as_ref().map_or(&[], |p| &p.out)
    }

    /// Mean loss over the targets.
    pub fn loss(&self) -> f64 {
        self.head.loss
    }

    /// `[T, V]` logits (full loss mode only).
    pub fn logits(&self) -> Option<&[f32]> {
        self.head.logits.as_deref()
    }
}

/// Which backward steps ran: frozen parts with nothing trainable below them run none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Visited {
    pub text_layers: usize,
    pub projector: bool,
    pub vision_layers: usize,
    pub patch_embed: bool,
}

/// The model: its config, its parameters (f32 master copy) and how it computes the loss.
#[derive(Clone, Debug)]
pub struct Mistral3 {
    pub cfg: Mistral3Config,
    pub params: Params,
    pub loss_mode: LossMode,
}

impl Mistral3 {
    /// Reads `dir/config.json` and the checkpoint in `dir`.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let cfg = Mistral3Config::from_file(&dir.join("config.json"))?;
        let params = weights::load_params(dir, ParamLayout::new(&cfg))?;
        Ok(Mistral3 {
            cfg,
            params,
            loss_mode: LossMode::Full,
        })
    }

    /// Gradient buffers for the given trainable parts.
    pub fn grads(&self, trainable: &[Part]) -> Grads {
        Grads::new(&self.params.layout, trainable)
    }

    /// What the batch alone cannot check: labels inside the vocabulary and as many `[IMG]`
    /// tokens as the images make (before any vision compute is spent on a bad batch).
    pub fn check_batch(&self, batch: &Batch) -> Result<(), ModelError> {
        batch.check()?;
        let vocab = self.cfg.text_config.vocab_size;
        if let Some(l) = batch
            .labels
            .iter()
            .find(|&&l| l >= 0 && l as usize >= vocab)
        {
            return Err(ModelError::Input(format!(
                "label {l} is outside the vocabulary ({vocab})"
            )));
        }
        let img = self.cfg.image_token_index;
        let tokens = batch.input_ids.iter().filter(|&&id| id == img).count();
        let patch = self.cfg.vision_config.patch_size;
        let features = batch
            .images
            .image_tokens(patch, self.cfg.spatial_merge_size);
        if tokens != features {
            return Err(ModelError::ImageTokens { tokens, features });
        }
        Ok(())
    }

    /// Forward through vision, projector, splice, decoder, lm_head and the loss.
    pub fn forward<A: Act>(&self, batch: &Batch) -> Result<ForwardActs<A>, ModelError> {
        let cfg = &self.cfg;
        let t = &cfg.text_config;
        self.check_batch(batch)?;
        if let LossMode::Chunked(0) = self.loss_mode {
            return Err(ModelError::Input("loss chunk size must be > 0".into()));
        }
        let (vision, projector) = if batch.images.is_empty() {
            (None, None)
        } else {
            let v = pixtral::forward::<A>(cfg, &self.params, &batch.images)?;
            let p = projector::forward(cfg, &self.params, &v.grid, v.output())?;
            (Some(v), Some(p))
        };
        let feats = projector.as_ref().map_or(&[][..], |p| &p.out);
        let x0 = mistral::embed(cfg, &self.params, &batch.input_ids, feats)?;
        let (pos, ends) = (
            batch.positions().into_owned(),
            batch.sequence_ends().into_owned(),
        );
        let text = mistral::forward(cfg, &self.params, x0, pos, ends)?;
        let targets = batch.targets();
        let w = self.params.text_head().lm_head;
        let (d, v) = (t.hidden_size, t.vocab_size);
        let head = head::forward(self.loss_mode, &text.xf, w, &targets, d, v)?;
        Ok(ForwardActs {
            vision,
            projector,
            text,
            head,
            targets,
        })
    }

    /// Backward of the mean loss: accumulates into the groups of `grads` that exist and, if
    /// `dpixels` is given, into the gradient of `pixel_values`. Parts that neither train nor
    /// lead to something that needs a gradient are not visited.
    pub fn backward<A: Act>(
        &self,
        batch: &Batch,
        a: &ForwardActs<A>,
        grads: &mut Grads,
        dpixels: Option<&mut [f32]>,
    ) -> Result<Visited, ModelError> {
        let cfg = &self.cfg;
        let t = &cfg.text_config;
        let layout = &self.params.layout;
        let trains = |part: Part| {
            layout
                .groups
                .iter()
                .zip(&grads.data)
                .any(|(g, d)| g.part == part && d.is_some())
        };
        let vision_needed = trains(Part::Vision) || dpixels.is_some();
        let image_needed = a.projector.is_some() && (trains(Part::Projector) || vision_needed);
        let embed_trains = grads.data[layout.text_embed()].is_some();
        let want_dx0 = embed_trains || image_needed;
        if !want_dx0 && grads.data.iter().all(Option::is_none) {
            return Ok(Visited::default());
        }

        let (d, v) = (t.hidden_size, t.vocab_size);
        let mut dxf = vec![0.0; a.text.rstd_f.len() * d];
        let hg = layout.text_head();
        let dw = grads
            .group_mut(hg)
            .map(|buf| params::TextHead::split_mut(buf, &layout.groups[hg]).lm_head);
        let w = self.params.text_head().lm_head;
        let (xf, targets) = (&a.text.xf, &a.targets);
        head::backward(self.loss_mode, &a.head, xf, w, targets, d, v, &mut dxf, dw)?;
        let (dx0, text) = mistral::backward(cfg, &self.params, &a.text, &dxf, grads, want_dx0)?;
        let mut visited = Visited {
            text_layers: text.layers,
            ..Visited::default()
        };
        let Some(mut dx0) = dx0 else {
            return Ok(visited);
        };
        let dembed = mistral::embed_grad(&self.params, grads);
        let dfeat = mistral::embed_backward(cfg, &batch.input_ids, &mut dx0, dembed)?;
        let (Some(v), Some(p)) = (&a.vision, &a.projector) else {
            return Ok(visited);
        };
        if !image_needed {
            return Ok(visited);
        }
        let images = self.backward_images(batch, v, p, &dfeat, grads, dpixels)?;
        visited.projector = images.projector;
        visited.vision_layers = images.vision_layers;
        visited.patch_embed = images.patch_embed;
        Ok(visited)
    }

    /// Projector + vision backward from the gradient of the image features `[M, D]`.
    pub fn backward_images<A: Act>(
        &self,
        batch: &Batch,
        v: &pixtral::PixtralActs<A>,
        p: &projector::ProjectorActs<A>,
        dfeat: &[f32],
        grads: &mut Grads,
        dpixels: Option<&mut [f32]>,
    ) -> Result<Visited, ModelError> {
        let cfg = &self.cfg;
        let layout = &self.params.layout;
        let vision_trains = (0..=layout.vision_layers).any(|g| grads.data[g].is_some());
        let vision_needed = vision_trains || dpixels.is_some();
        let mut dvis = vision_needed.then(|| vec![0.0; v.output().len()]);
        let x = v.output();
        projector::backward(cfg, &self.params, p, x, dfeat, grads, dvis.as_deref_mut())?;
        let mut visited = Visited {
            projector: true,
            ..Visited::default()
        };
        if let Some(dvis) = dvis {
            let images = &batch.images;
            let vv = pixtral::backward(cfg, &self.params, v, images, &dvis, grads, dpixels)?;
            visited.vision_layers = vv.layers;
            visited.patch_embed = vv.patch_embed;
        }
        Ok(visited)
    }
}
