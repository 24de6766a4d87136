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
//! mistral::forward   [T,D] -> logits [T,V]      mistral::backward
//! ops::cross_entropy logits, shifted labels     (saves dlogits)
//! ```
//!
//! Frozen parts (by default the vision tower and the projector, [`Part`]) have no gradient
//! buffer, and their backward is not run at all unless something below them needs it.

pub mod block;
pub mod config;
pub mod mistral;
pub mod ops;
pub mod optim;
pub mod params;
pub mod pixtral;
pub mod projector;
pub mod weights;

pub use config::{ConfigError, Mistral3Config};
pub use ops::Precision;
pub use params::{Grads, ParamLayout, Params, Part};
pub use pixtral::Images;
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
    #[error(transparent)]
    Kernel(#[from] cannon_kernels::KernelError),
}

/// One training batch: `rows` sequences of `seq` tokens, and the images they refer to.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub input_ids: Vec<u32>, // [rows*seq]
    pub labels: Vec<i64>,    // [rows*seq], -100 = not trained
    pub rows: usize,
    pub seq: usize,
    pub images: Images,
}

impl Batch {
    /// Next-token targets: position t of a row is trained on the label at t+1 (-100 at the
    /// row's last position), as transformers' ForCausalLMLoss shifts.
    pub fn targets(&self) -> Vec<i64> {
        let mut out = vec![-100; self.labels.len()];
        for (o, l) in out
            .chunks_exact_mut(self.seq.max(1))
            .zip(self.labels.chunks_exact(self.seq.max(1)))
        {
            o[..l.len() - 1].copy_from_slice(&l[1..]);
        }
        out
    }

    fn validate(&self, vocab: usize) -> Result<(), ModelError> {
        let n = self.rows * self.seq;
        if self.input_ids.len() != n || self.labels.len() != n || n == 0 {
            return Err(ModelError::Input(format!(
                "input_ids ({}) and labels ({}) must both hold rows*seq = {}x{} > 0 tokens",
                self.input_ids.len(),
                self.labels.len(),
                self.rows,
                self.seq
            )));
        }
        if let Some(l) = self
            .labels
            .iter()
            .find(|&&l| l != -100 && (l < 0 || l as usize >= vocab))
        {
            return Err(ModelError::Input(format!(
                "label {l} is neither -100 nor inside the vocabulary ({vocab})"
            )));
        }
        Ok(())
    }
}

/// What the whole forward saves.
#[derive(Clone, Debug)]
pub struct ForwardActs {
    pub vision: Option<pixtral::PixtralActs>,
    pub projector: Option<projector::ProjectorActs>,
    pub text: mistral::TextActs,
    /// d loss / d logits `[T,V]`, written with the loss.
    pub dlogits: Vec<f32>,
    pub loss: f64,
    /// Targets that count in the mean.
    pub targets: usize,
}

impl ForwardActs {
    /// Projector output `[M, D]` (empty without images).
    pub fn image_features(&self) -> &[f32] {
        self.projector.as_ref().map_or(&[], |p| &p.out)
    }
}

/// The model: its config and its parameters (f32 master copy).
#[derive(Clone, Debug)]
pub struct Mistral3 {
    pub cfg: Mistral3Config,
    pub params: Params,
}

impl Mistral3 {
    /// Reads `dir/config.json` and the checkpoint in `dir`.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let cfg = Mistral3Config::from_file(&dir.join("config.json"))?;
        let params = weights::load_params(dir, ParamLayout::new(&cfg))?;
        Ok(Mistral3 { cfg, params })
    }

    /// A copy whose parameters are rounded to `prec` (the compute copy of a bf16 run).
    pub fn rounded(&self, prec: Precision) -> Self {
        let mut m = self.clone();
        for g in &mut m.params.data {
            prec.round(g);
        }
        m
    }

    /// Gradient buffers for the given trainable parts.
    pub fn grads(&self, trainable: &[Part]) -> Grads {
        Grads::new(&self.params.layout, trainable)
    }

    /// Forward through vision, projector, splice, decoder and the loss.
    pub fn forward(&self, batch: &Batch, prec: Precision) -> Result<ForwardActs, ModelError> {
        let cfg = &self.cfg;
        batch.validate(cfg.text_config.vocab_size)?;
        let (vision, projector) = if batch.images.is_empty() {
            (None, None)
        } else {
            let v = pixtral::forward(cfg, &self.params, &batch.images, prec)?;
            let p = projector::forward(cfg, &self.params, &v.grid, v.output(), prec)?;
            (Some(v), Some(p))
        };
        let feats = projector.as_ref().map_or(&[][..], |p| &p.out);
        let x0 = mistral::embed(cfg, &self.params, &batch.input_ids, feats)?;
        let text = mistral::forward(cfg, &self.params, x0, batch.rows, batch.seq, prec)?;
        let mut dlogits = vec![0.0; text.logits.len()];
        let (loss, targets) = ops::cross_entropy(
            &mut dlogits,
            &text.logits,
            &batch.targets(),
            cfg.text_config.vocab_size,
        );
        Ok(ForwardActs {
            vision,
            projector,
            text,
            dlogits,
            loss,
            targets,
        })
    }

    /// Backward of the mean loss: accumulates into the groups of `grads` that exist and, if
    /// `dpixels` is given, into the gradient of `pixel_values`. Parts that neither train nor
    /// lead to something that needs a gradient are not visited.
    pub fn backward(
        &self,
        batch: &Batch,
        a: &ForwardActs,
        grads: &mut Grads,
        dpixels: Option<&mut [f32]>,
        prec: Precision,
    ) -> Result<(), ModelError> {
        let cfg = &self.cfg;
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
        let dx0 = mistral::backward(
            cfg,
            &self.params,
            &a.text,
            &a.dlogits,
            grads,
            want_dx0,
            prec,
        )?;
        let Some(dx0) = dx0.filter(|_| want_dx0) else {
            return Ok(());
        };
        let dembed = mistral::embed_grad(&self.params, grads);
        let dfeat = mistral::embed_backward(cfg, &batch.input_ids, &dx0, dembed);
        if !image_needed {
            return Ok(());
        }
        let (Some(v), Some(p)) = (&a.vision, &a.projector) else {
            return Ok(());
        };
        self.backward_images(batch, v, p, &dfeat, grads, dpixels, prec)
    }

    /// Projector + vision backward from the gradient of the image features `[M, D]`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_images(
        &self,
        batch: &Batch,
        v: &pixtral::PixtralActs,
        p: &projector::ProjectorActs,
        dfeat: &[f32],
        grads: &mut Grads,
        dpixels: Option<&mut [f32]>,
        prec: Precision,
    ) -> Result<(), ModelError> {
        let cfg = &self.cfg;
        let layout = &self.params.layout;
        let vision_trains = (0..=layout.vision_layers).any(|g| grads.data[g].is_some());
        let vision_needed = vision_trains || dpixels.is_some();
        let mut dvis = vision_needed.then(|| vec![0.0; v.output().len()]);
        projector::backward(
            cfg,
            &self.params,
            p,
            v.output(),
            dfeat,
            grads,
            dvis.as_deref_mut(),
        )?;
        if let Some(dvis) = dvis {
            pixtral::backward(
                cfg,
                &self.params,
                v,
                &batch.images,
                &dvis,
                grads,
                dpixels,
                prec,
            )?;
        }
        Ok(())
    }
}
