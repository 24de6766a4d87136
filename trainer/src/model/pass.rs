//! A forward or backward pass of the whole model over a parameter source ([`ModelPass`]), what
//! its forward saves ([`ForwardActs`]) and what its backward visited ([`BackwardSteps`]): the
//! steps of the module docs of [`super`], in order, for the model's own parameters and for
//! a sharded rank's alike.

use super::config::Mistral3Config;
use super::error::ModelError;
use super::head::{self, head_view, Logits, LossMode};
use super::params::{self, Part};
use super::precision::ActElem;
use super::saved::MemoryFeatures;
use super::source::{self, group_grad, GradSink, GroupOrder, ParamSource};
use super::{mistral, pixtral, projector};
use crate::model::batch::Batch;
use crate::parallel::cp::{CpGroup, CpLayout};
use cannon_kernels::cross_entropy::{LossNorm, IGNORE_INDEX};
use cannon_kernels::device_ctx::DeviceCtx;
use cannon_kernels::{ops as kops, Tensor};

/// What the whole forward saves (activations stored as `A`), on the model's device.
#[derive(Debug)]
pub struct ForwardActs<A: cannon_runtime::Element> {
    pub vision: Option<pixtral::PixtralActs<A>>,
    pub projector: Option<projector::ProjectorActs<A>>,
    pub text: mistral::TextActs<A>,
    pub head: head::HeadActs,
    /// `[T]` next-token targets (`IGNORE_INDEX` = ignored), host data (under context
    /// parallelism: this rank's `[Tl]` shard).
    pub targets: Vec<i32>,
    /// Calls the CP group's communicators issued while the vision tower and the projector
    /// ran (0 without CP; context parallelism must not add any there).
    pub vision_cp_calls: u64,
}

impl<A: cannon_runtime::Element> ForwardActs<A> {
    /// Projector output `[M, D]` (None without images).
    pub fn image_features(&self) -> Option<&Tensor<f32>> {
        self.projector.as_ref().map(|p| &p.out)
    }

    /// The loss: summed over the targets, divided as the forward was asked (the mean by
    /// default).
    pub fn loss(&self) -> f64 {
        self.head.loss
    }

    /// `[T, V]` logits: full loss mode, from a forward that keeps them ([`ModelPass::logits`];
    /// [`super::Mistral3::forward`] does, a training forward does not).
    pub fn logits(&self) -> Option<&Tensor<f32>> {
        self.head.logits.as_ref()
    }
}

/// Which backward steps ran: frozen parts with nothing trainable below them run none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackwardSteps {
    pub text_layers: usize,
    pub projector: bool,
    pub vision_layers: usize,
    pub patch_embed: bool,
    /// Calls the CP group's communicators issued during the projector and vision backward
    /// (0 without CP; context parallelism must add none there).
    pub vision_cp_calls: u64,
}

/// One forward or backward over a [`ParamSource`]: the model as a pass sees it. The
/// [`super::Mistral3`] methods are passes over the model's own [`super::Params`] and
/// [`super::Grads`]; a sharded rank (`crate::parallel::fsdp`) runs the same passes over its gathering
/// source and reduce-scattering sink, with the step's global target count as the loss
/// divisor.
#[derive(Clone, Copy)]
pub struct ModelPass<'a> {
    pub cfg: &'a Mistral3Config,
    pub exec: &'a DeviceCtx,
    pub loss_mode: LossMode,
    /// What the decoder layers keep for the backward, and where (`super::saved`).
    pub memory: MemoryFeatures,
    pub params: &'a dyn ParamSource,
    /// What the summed loss is divided by: `Mean`, the batch's own trained targets;
    /// `Divisor(n)`, the trained targets of every micro batch on every rank of the optimizer
    /// step, so that the summed gradients are the gradient of the step's mean.
    pub loss_norm: LossNorm,
    /// What the full loss leaves of its `[T, V]` logits: their gradient written over them
    /// (training), the logits beside their gradient (verify), or the logits alone (the
    /// held-out evaluation); each `4·T·V` bytes.
    pub logits: Logits,
    /// Context parallelism (`crate::parallel::cp`): the vision tower, projector and splice run on the
    /// whole batch, the decoder and the loss on this rank's token shard of the group. The
    /// head's `sum` and `targets` are then this rank's; with `LossNorm::Mean` the divisor is
    /// the group's target count (a sum over the group), so the ranks' gradients add up to
    /// the batch's, each rank's holding the image feature, projector, vision and embedding
    /// gradients of its own tokens only. None: every token is here.
    pub cp: Option<&'a CpGroup>,
}

impl ModelPass<'_> {
    /// What the batch alone cannot check: labels inside the vocabulary and as many `[IMG]`
    /// tokens as the images make (before any vision compute is spent on a bad batch).
    pub fn check_batch(&self, batch: &Batch) -> Result<(), ModelError> {
        check_batch(self.cfg, batch)
    }

    /// Forward through vision, projector, splice, decoder, lm_head and the loss, fetching
    /// each group in the order of [`GroupOrder::forward`] (on this rank's token shard under
    /// context parallelism: [`ModelPass::cp`]).
    pub fn forward<A: ActElem>(&self, batch: &Batch) -> Result<ForwardActs<A>, ModelError> {
        let cp = self.cp;
        let cfg = self.cfg;
        let ex = self.exec;
        let params = self.params;
        let t = &cfg.text_config;
        self.check_batch(batch)?;
        if let LossMode::Chunked(0) = self.loss_mode {
            return Err(ModelError::Input("loss chunk size must be > 0".into()));
        }
        // The groups this forward fetches, in order (a source copying them in goes ahead).
        let plan = GroupOrder::new(
            cfg,
            params.layout(),
            source::PlanInputs {
                trains: &|_| false,
                images: !batch.images.is_empty(),
                dpixels: false,
            },
        );
        params.begin(&plan.forward)?;
        let calls = || cp.map_or(0, CpGroup::calls);
        let calls_before = calls();
        let (vision, projector) = if batch.images.is_empty() {
            (None, None)
        } else {
            let v = pixtral::forward::<A>(ex, cfg, params, &batch.images)?;
            let x = v.output().view();
            let p = projector::forward(ex, cfg, params, &v.grid, &x)?;
            (Some(v), Some(p))
        };
        let vision_cp_calls = calls() - calls_before;
        let feats = projector.as_ref().map(|p| &p.out);
        let x0 = mistral::embed(ex, cfg, params, &batch.input_ids, feats)?;
        let (pos, ends) = (
            batch.positions().into_owned(),
            batch.sequence_ends().into_owned(),
        );
        let mut targets = batch.targets();
        let mut norm = self.loss_norm;
        // The head group (final norm + lm_head) is fetched once, by the decoder's final norm.
        let (text, head_w) = match cp {
            None => mistral::forward(ex, cfg, params, x0, pos, ends, self.memory, None)?,
            Some(g) => {
                // Split after the splice; positions and sequence ends are the whole batch's.
                let layout = g.layout(pos.len(), &ends)?;
                // The whole batch's embeddings go once this rank's rows are copied out.
                let x0 = {
                    let whole = x0;
                    cp_shard_rows(ex, &layout, &whole, t.hidden_size)?
                };
                let pos_l = layout.shard(&pos, 0);
                targets = layout.shard(&targets, IGNORE_INDEX);
                if norm == LossNorm::Mean {
                    let mine = targets.iter().filter(|&&l| l != IGNORE_INDEX).count();
                    let all = g.sum(&[mine as f64], ex.stream())?[0];
                    if all > 0.0 {
                        norm = LossNorm::Divisor(all);
                    }
                }
                let cp = Some((g, layout));
                mistral::forward(ex, cfg, params, x0, pos_l, ends, self.memory, cp)?
            }
        };
        let w = head_view(params.layout(), &head_w)?.lm_head;
        let dv = (t.hidden_size, t.vocab_size);
        let out = self.logits;
        let head = head::forward(ex, self.loss_mode, &text.xf, &w, &targets, dv, norm, out)?;
        drop(head_w);
        Ok(ForwardActs {
            vision,
            projector,
            text,
            head,
            targets,
            vision_cp_calls,
        })
    }

    /// Backward of the loss: accumulates into the groups `grads` trains and, if `dpixels`
    /// (laid out like `Images::pixel_values`) is given, into its gradient, visiting the groups
    /// in the order of [`GroupOrder::backward`]. Parts that neither train nor lead to something
    /// that needs a gradient are not visited. Under context parallelism ([`ModelPass::cp`], the
    /// group the forward ran with) this rank's share of every gradient.
    pub fn backward<A: ActElem>(
        &self,
        batch: &Batch,
        a: &ForwardActs<A>,
        grads: &mut dyn GradSink,
        dpixels: Option<&mut Tensor<f32>>,
    ) -> Result<BackwardSteps, ModelError> {
        let cp = self.cp;
        let cfg = self.cfg;
        let ex = self.exec;
        let params = self.params;
        let t = &cfg.text_config;
        let layout = params.layout();
        let trains = |grads: &dyn GradSink, part: Part| {
            (0..layout.groups.len()).any(|g| layout.groups[g].part == part && grads.trains(g))
        };
        let vision_needed = trains(grads, Part::Vision) || dpixels.is_some();
        let image_needed =
            a.projector.is_some() && (trains(grads, Part::Projector) || vision_needed);
        let embed_trains = grads.trains(layout.text_embed());
        let want_dx0 = embed_trains || image_needed;
        if !want_dx0 && !(0..layout.groups.len()).any(|g| grads.trains(g)) {
            return Ok(BackwardSteps::default());
        }

        // The groups this backward fetches, in order (a source copying them in goes ahead).
        let order: Vec<usize> = {
            let trains = |g: usize| grads.trains(g);
            let inputs = source::PlanInputs {
                trains: &trains,
                images: a.projector.is_some(),
                dpixels: dpixels.is_some(),
            };
            let plan = GroupOrder::new(cfg, layout, inputs);
            plan.backward
                .iter()
                .filter(|s| s.fetch)
                .map(|s| s.group)
                .collect()
        };
        params.begin(&order)?;
        let dv = (t.hidden_size, t.vocab_size);
        let mut dxf = ex.zeros(&[a.text.tokens(), t.hidden_size])?;
        let hg = layout.text_head();
        // The head group is fetched once: the lm_head backward here, the final norm's in the
        // decoder backward, which lets it go before the first layer is fetched.
        let head_w = params.fetch(hg)?;
        {
            let w = head_view(layout, &head_w)?.lm_head;
            let at = params::TextHead::ranges(&layout.groups[hg]);
            let mut hgrad = group_grad(grads, hg, at)?;
            let dw = hgrad.as_mut().map(|g| g.win(|r| &r.lm_head)).transpose()?;
            let (xf, targets) = (&a.text.xf, &a.targets);
            head::backward(
                ex,
                self.loss_mode,
                &a.head,
                xf,
                &w,
                targets,
                dv,
                &mut dxf,
                dw,
            )?;
        }
        let (dx0, text) =
            mistral::backward(ex, cfg, params, head_w, &a.text, dxf, grads, want_dx0, cp)?;
        let mut visited = BackwardSteps {
            text_layers: text.layers,
            ..BackwardSteps::default()
        };
        let Some(dx0) = dx0 else {
            return Ok(visited);
        };
        // A CP rank's dx0 holds its tokens: scattered into the batch's rows, zero elsewhere.
        // (The rank's own rows are freed at once.)
        let mut dx0 = match &a.text.cp {
            Some(l) => {
                let mine = dx0;
                cp_unshard_rows(ex, l, &mine, t.hidden_size)?
            }
            None => dx0,
        };
        let eg = layout.text_embed();
        let dfeat = {
            let dembed = grads.grad(eg)?;
            mistral::embed_backward(ex, cfg, &batch.input_ids, &mut dx0, dembed)?
        };
        grads.release(eg)?;
        drop(dx0);
        let (Some(v), Some(p)) = (&a.vision, &a.projector) else {
            return Ok(visited);
        };
        if !image_needed {
            return Ok(visited);
        }
        let calls_before = cp.map_or(0, CpGroup::calls);
        let images = self.backward_images(batch, v, p, dfeat, grads, dpixels)?;
        visited.vision_cp_calls = cp.map_or(0, CpGroup::calls) - calls_before;
        visited.projector = images.projector;
        visited.vision_layers = images.vision_layers;
        visited.patch_embed = images.patch_embed;
        Ok(visited)
    }

    /// Projector + vision backward from the gradient of the image features `[M, D]`
    /// (consumed).
    pub fn backward_images<A: ActElem>(
        &self,
        batch: &Batch,
        v: &pixtral::PixtralActs<A>,
        p: &projector::ProjectorActs<A>,
        dfeat: Tensor<f32>,
        grads: &mut dyn GradSink,
        dpixels: Option<&mut Tensor<f32>>,
    ) -> Result<BackwardSteps, ModelError> {
        let cfg = self.cfg;
        let ex = self.exec;
        let params = self.params;
        let layout = params.layout();
        let vision_trains = (0..=layout.vision_layers).any(|g| grads.trains(g));
        let vision_needed = vision_trains || dpixels.is_some();
        let x = v.output();
        let mut dvis = vision_needed.then(|| ex.zeros(x.shape())).transpose()?;
        let dvis_view = dvis.as_mut().map(Tensor::view_mut);
        let (xv, dfv) = (x.view(), dfeat.view());
        projector::backward(ex, cfg, params, p, &xv, &dfv, grads, dvis_view)?;
        drop(dfeat);
        let mut visited = BackwardSteps {
            projector: true,
            ..BackwardSteps::default()
        };
        if let Some(dvis) = dvis {
            let images = &batch.images;
            let vv = pixtral::backward(ex, cfg, params, v, images, dvis, grads, dpixels)?;
            visited.vision_layers = vv.layers;
            visited.patch_embed = vv.patch_embed;
        }
        Ok(visited)
    }
}

/// `[Tl, D]` rows of this CP rank from the batch's `x [T, D]` (padding rows zero).
fn cp_shard_rows(
    ex: &DeviceCtx,
    layout: &CpLayout,
    x: &Tensor<f32>,
    d: usize,
) -> Result<Tensor<f32>, ModelError> {
    let st = ex.stream();
    let (rows, global): (Vec<usize>, Vec<usize>) = layout.real().unzip();
    let mut out = ex.zeros(&[layout.local_tokens(), d])?;
    let mut compact = ex.empty::<f32>(&[rows.len(), d])?;
    kops::gather_rows(st, &mut compact.view_mut(), &x.view(), &global, d)?;
    kops::scatter_rows(st, &mut out.view_mut(), &compact.view(), &rows, d)?;
    Ok(out)
}

/// Adjoint of [`cp_shard_rows`]: this rank's `dx [Tl, D]` in the batch's `[T, D]` rows,
/// zero in the rows of other ranks' tokens.
fn cp_unshard_rows(
    ex: &DeviceCtx,
    layout: &CpLayout,
    dx: &Tensor<f32>,
    d: usize,
) -> Result<Tensor<f32>, ModelError> {
    let st = ex.stream();
    let (rows, global): (Vec<usize>, Vec<usize>) = layout.real().unzip();
    let mut out = ex.zeros(&[layout.tokens, d])?;
    let mut compact = ex.empty::<f32>(&[rows.len(), d])?;
    kops::gather_rows(st, &mut compact.view_mut(), &dx.view(), &rows, d)?;
    kops::scatter_rows(st, &mut out.view_mut(), &compact.view(), &global, d)?;
    Ok(out)
}

/// What the batch alone cannot check: labels inside the vocabulary and as many `[IMG]`
/// tokens as the images make.
pub fn check_batch(cfg: &Mistral3Config, batch: &Batch) -> Result<(), ModelError> {
    batch.check()?;
    let vocab = cfg.text_config.vocab_size;
    if let Some(l) = batch
        .labels
        .iter()
        .find(|&&l| l >= 0 && l as usize >= vocab)
    {
        return Err(ModelError::Input(format!(
            "label {l} is outside the vocabulary ({vocab})"
        )));
    }
    let img = cfg.image_token_index;
    let tokens = batch.input_ids.iter().filter(|&&id| id == img).count();
    let patch = cfg.vision_config.patch_size;
    let features = batch.images.image_tokens(patch, cfg.spatial_merge_size);
    if tokens != features {
        return Err(ModelError::ImageTokens { tokens, features });
    }
    Ok(())
}
