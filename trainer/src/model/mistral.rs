//! The Mistral language model, forward and backward, and the splice of image features into
//! the `[IMG]` positions.
//!
//! ```text
//! x0      = embed_tokens[ids]                      [T,D]   T = B*S tokens
//! x0[t]   = image_features[k]  for the k-th t with ids[t] == image_token_index
//! x_l+1   = block_l(x_l)                           GQA, causal within each packed sequence,
//!                                                  1-D RoPE at each token's position id
//! xf      = norm(x_L)                              [T,D]   (then the head, see `head`)
//! ```
//!
//! Packed sequences: a row may hold several sequences back to back. As transformers 5.x does
//! for packed input without an attention mask, a new sequence starts at every row start and
//! wherever `position_ids[t] != position_ids[t-1] + 1`; the attention's `cu_seqlens` are those
//! sequences' ends (the batch's, [`crate::model::batch::Batch::sequence_ends`]), so no token sees
//! another sequence.

use super::block::{block_forward, BlockActs, BlockCtx, BlockDims, BlockParams, FwdScratch};
use super::block_backward::{block_backward, BwdScratch};
use super::config::{HiddenAct, Mistral3Config};
use super::head::head_view;
use super::params::{TextEmbed, TextHead, TextLayer};
use super::precision::{store, ActElem};
use super::saved::{LayerSaved, MemoryFeatures, Restored};
use super::source::{group_grad, GradSink, GroupWeights, ParamSource};
use super::ModelError;
use crate::parallel::cp::attn::{CpCtx, SeqAttention};
use crate::parallel::cp::{CpGroup, CpLayout};
use cannon_kernels::device_ctx::DeviceCtx;
use cannon_kernels::rope::RopeTable;
use cannon_kernels::{ops, Tensor};
use cannon_runtime::trace::{self, Cat};
use cannon_runtime::BufferViewMut;
use cannon_runtime::CopyMark;

/// Everything the text forward saves (device tensors, or host copies when offloaded;
/// positions, RoPE table and sequence ends are host data the kernels take as such).
#[derive(Debug)]
pub struct TextActs<A: cannon_runtime::Element> {
    pub rope: RopeTable,
    /// `[T]` position id of every token (its RoPE slot).
    pub pos: Vec<u32>,
    /// Ends of the packed sequences: tokens never attend across them.
    pub cu_seqlens: Vec<usize>,
    /// L x what layer l keeps: its input `[T,D]` (the spliced embeddings for layer 0) and
    /// its activations, as `train.recompute` and `train.offload_activations` say
    /// ([`super::saved`]).
    pub layers: Vec<LayerSaved<A>>,
    /// `[T,D]` the last layer's output (the spliced embeddings with no layer).
    pub out: Tensor<f32>,
    pub rstd_f: Tensor<f32>, // [T]
    pub xf: Tensor<A>,       // [T,D] final norm output (the lm_head's input)
    /// Under context parallelism: this rank's token layout (T above is then its Tl tokens,
    /// `cu_seqlens` the whole batch's).
    pub cp: Option<CpLayout>,
}

impl<A: cannon_runtime::Element> TextActs<A> {
    /// The decoder's last hidden state (the final norm's input).
    pub fn last(&self) -> &Tensor<f32> {
        &self.out
    }

    /// Tokens of the batch.
    pub fn tokens(&self) -> usize {
        self.pos.len()
    }
}

pub(crate) fn dims(cfg: &Mistral3Config) -> BlockDims {
    let t = &cfg.text_config;
    BlockDims {
        d: t.hidden_size,
        q_heads: t.num_attention_heads,
        kv_heads: t.num_key_value_heads,
        head_dim: t.head_dim(),
        inter: t.intermediate_size,
        causal: true,
        act: HiddenAct::Silu,
        eps: t.rms_norm_eps as f32,
    }
}

impl<T> TextLayer<T> {
    /// The layer's tensors in block order.
    pub fn block(self) -> BlockParams<T> {
        BlockParams {
            attn_norm: self.attn_norm,
            q: self.q,
            k: self.k,
            v: self.v,
            o: self.o,
            mlp_norm: self.mlp_norm,
            gate: self.gate,
            up: self.up,
            down: self.down,
        }
    }
}

/// The rows of the `[IMG]` tokens, in order (where the image features go).
pub fn image_slots(cfg: &Mistral3Config, ids: &[u32]) -> Vec<usize> {
    let img = cfg.image_token_index;
    (0..ids.len()).filter(|&t| ids[t] == img).collect()
}

/// `x0 [T,D]`: token embeddings with the image features `[M,D]` spliced into the `[IMG]`
/// positions (a row scatter on the device).
pub fn embed(
    exec: &DeviceCtx,
    cfg: &Mistral3Config,
    params: &dyn ParamSource,
    ids: &[u32],
    image_features: Option<&Tensor<f32>>,
) -> Result<Tensor<f32>, ModelError> {
    let st = exec.stream();
    let d = cfg.text_config.hidden_size;
    let slots = image_slots(cfg, ids);
    let features = image_features.map_or(0, |f| f.numel() / d.max(1));
    if slots.len() != features {
        return Err(ModelError::ImageTokens {
            tokens: slots.len(),
            features,
        });
    }
    let mut x = exec.empty(&[ids.len(), d])?;
    let g = params.layout().text_embed();
    let w = params.fetch(g)?;
    let table = TextEmbed::split(w.view()?, &params.layout().groups[g])?.embed;
    ops::embedding_forward(st, &mut x.view_mut(), ids, &table, d)?;
    drop(w);
    if let Some(f) = image_features.filter(|_| !slots.is_empty()) {
        ops::scatter_rows(st, &mut x.view_mut(), &f.view(), &slots, d)?;
    }
    Ok(x)
}

/// Backward of [`embed`]: gathers the `[IMG]` rows of `dx0 [T,D]` as the gradient of the image
/// features `[M,D]` (returned, in `[IMG]` order), zeroes them, and if the embedding trains
/// (`dembed` given) scatter-adds the text rows into its gradient.
pub fn embed_backward(
    exec: &DeviceCtx,
    cfg: &Mistral3Config,
    ids: &[u32],
    dx0: &mut Tensor<f32>,
    dembed: Option<BufferViewMut<'_, f32>>,
) -> Result<Tensor<f32>, ModelError> {
    let st = exec.stream();
    let d = cfg.text_config.hidden_size;
    let slots = image_slots(cfg, ids);
    let mut dfeat = exec.empty(&[slots.len(), d])?;
    if !slots.is_empty() {
        ops::gather_rows(st, &mut dfeat.view_mut(), &dx0.view(), &slots, d)?;
        ops::zero_rows(st, &mut dx0.view_mut(), &slots, d)?;
    }
    if let Some(mut de) = dembed {
        ops::embedding_backward(st, &mut de, &dx0.view(), ids, d)?;
    }
    Ok(dfeat)
}

/// Decoder forward from `x0 [T,D]` (tokens at position ids `pos`, packed sequences ending at
/// `cu_seqlens`, see [`crate::model::batch::sequence_ends`]) to the final norm's output. Each layer's
/// group is fetched just before the layer runs and let go after it; the head group, fetched
/// for the final norm, is handed back for the lm_head. `mem` says what each layer keeps and
/// where ([`super::saved`]).
///
/// A context-parallel rank (`cp` given) passes its tokens of the layout as `x0 [Tl,D]` and
/// `pos [Tl]`, and the whole batch's sequence ends as `cu_seqlens`; attention exchanges with
/// the CP group ([`crate::parallel::cp`]). Recompute and offload work per rank on its own tensors,
/// whatever their (head-sharded) shapes.
#[allow(clippy::too_many_arguments)]
pub fn forward<'p, A: ActElem>(
    exec: &DeviceCtx,
    cfg: &Mistral3Config,
    params: &'p dyn ParamSource,
    x0: Tensor<f32>,
    pos: Vec<u32>,
    cu_seqlens: Vec<usize>,
    mem: MemoryFeatures,
    cp: Option<(&CpGroup, CpLayout)>,
) -> Result<(TextActs<A>, GroupWeights<'p>), ModelError> {
    let st = exec.stream();
    let t = &cfg.text_config;
    let (group, cpl) = match cp {
        Some((g, l)) => (Some(g), Some(l)),
        None => (None, None),
    };
    let whole = cpl.as_ref().map_or(pos.len(), |l| l.tokens);
    if cpl.as_ref().is_some_and(|l| l.local_tokens() != pos.len())
        || cu_seqlens.last() != Some(&whole)
        || pos.len() * t.hidden_size != x0.numel()
    {
        return Err(ModelError::Input(format!(
            "{} position ids, {} embedding values and sequences ending at {:?} disagree",
            pos.len(),
            x0.numel(),
            cu_seqlens.last()
        )));
    }
    if let Some(w) = t.sliding_window {
        let mut start = 0;
        for &end in &cu_seqlens {
            if end - start > w {
                return Err(ModelError::Input(format!(
                    "a sequence of {} tokens exceeds sliding_window {w} (windowed attention \
                     is not implemented)",
                    end - start
                )));
            }
            start = end;
        }
    }
    let d = t.hidden_size;
    let n = pos.len();
    let dims = dims(cfg);
    let max_pos = pos.iter().max().map_or(0, |&p| p as usize + 1);
    if max_pos > t.max_position_embeddings {
        return Err(ModelError::Input(format!(
            "position id {} is past max_position_embeddings {}",
            max_pos - 1,
            t.max_position_embeddings
        )));
    }
    let rope = RopeTable::text(t.head_dim(), t.rope_theta(), max_pos)?;
    let layout = params.layout();
    let pool = match (mem.offload_activations, exec.host_pool()) {
        (false, _) => None,
        (true, Some(p)) => Some(p.clone()),
        (true, None) => {
            return Err(ModelError::Input(
                "activation offload needs an exec with a host pool (DeviceCtx::with_host_pool)"
                    .into(),
            ))
        }
    };
    let layers_n = t.num_hidden_layers;
    let mut scratch = FwdScratch::new(exec, &dims, n)?;
    let mut layers: Vec<LayerSaved<A>> = Vec::with_capacity(layers_n);
    let mut x = x0;
    for l in 0..layers_n {
        let _span = trace::span_at("text layer forward", l, Cat::Layer);
        let ctx = BlockCtx {
            dims,
            rope: &rope,
            pos: &pos,
            attention: seq_attention(exec, group.zip(cpl.as_ref()), &cu_seqlens),
        };
        let mut acts = BlockActs::for_ctx(exec, &ctx, n)?;
        let mut out = exec.empty(&[n, d])?;
        let g = layout.text_layer(l);
        let fetched = params.fetch(g)?;
        let w = TextLayer::split(fetched.view()?, &layout.groups[g])?.block();
        block_forward(
            st,
            &ctx,
            &w,
            &mut acts,
            &mut scratch,
            &x.view(),
            &mut out.view_mut(),
        )?;
        let mut saved = LayerSaved::keep(x, acts, mem.recompute);
        // The last layer's backward comes first: it stays. The previous layer's device
        // copies are freed once this layer ran (its copy to the host overlapped it).
        if let (Some(p), true) = (&pool, l + 1 < layers_n) {
            saved.offload(p, st)?;
        }
        if let Some(prev) = layers.last_mut() {
            prev.settle()?;
        }
        layers.push(saved);
        x = out;
    }
    drop(scratch);
    let head_w = params.fetch(layout.text_head())?;
    let head = head_view(layout, &head_w)?;
    let mut rstd_f = exec.empty(&[n])?;
    let mut xf = exec.empty(&[n, d])?;
    let mut xf32 = exec.empty::<f32>(&[n, d])?;
    let last = x.view();
    let mut rv = rstd_f.view_mut();
    ops::rmsnorm_forward(
        st,
        &mut xf32.view_mut(),
        &mut rv,
        &last,
        &head.norm,
        d,
        dims.eps,
    )?;
    store(st, &xf32.view(), &mut xf.view_mut())?;
    let acts = TextActs {
        rope,
        pos,
        cu_seqlens,
        layers,
        out: x,
        rstd_f,
        xf,
        cp: cpl,
    };
    Ok((acts, head_w))
}

/// How the decoder's attention sees the sequence: every token here (sequences ending at
/// `cu_seqlens`), or across the CP group.
fn seq_attention<'a>(
    exec: &'a DeviceCtx,
    cp: Option<(&'a CpGroup, &'a CpLayout)>,
    cu_seqlens: &'a [usize],
) -> SeqAttention<'a> {
    match cp {
        Some((group, layout)) => SeqAttention::Group(CpCtx {
            exec,
            group,
            layout,
        }),
        None => SeqAttention::Local { cu_seqlens },
    }
}

/// What the decoder backward did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TextVisit {
    /// Decoder layers whose backward ran (from the top).
    pub layers: usize,
}

/// Decoder backward from `dxf [T,D]` (the gradient of the final norm's output, consumed: it
/// becomes a working tensor): accumulates into the text groups that train and, when
/// `want_dx0`, returns the gradient of `x0`. `head_w` is the head group the caller fetched
/// for the lm_head backward; the final norm's backward uses it and lets it go. Layers below
/// the lowest trained one are not visited when `x0` needs no gradient.
/// Under context parallelism `cp` is the group the forward ran with.
#[allow(clippy::too_many_arguments)]
pub fn backward<A: ActElem>(
    exec: &DeviceCtx,
    cfg: &Mistral3Config,
    params: &dyn ParamSource,
    head_w: GroupWeights<'_>,
    a: &TextActs<A>,
    dxf: Tensor<f32>,
    grads: &mut dyn GradSink,
    want_dx0: bool,
    cp: Option<&CpGroup>,
) -> Result<(Option<Tensor<f32>>, TextVisit), ModelError> {
    let st = exec.stream();
    if a.cp.is_some() != cp.is_some() {
        return Err(ModelError::Input(
            "the decoder backward must run with the CP group of its forward (and only then)".into(),
        ));
    }
    let t = &cfg.text_config;
    let d = t.hidden_size;
    let n = a.tokens();
    let layout = params.layout();
    let hg = layout.text_head();
    let dims = dims(cfg);
    let mut scratch = BwdScratch::<A>::new(exec, &dims, n)?;
    let mut dx = exec.zeros(&[n, d])?;
    {
        let head = head_view(layout, &head_w)?;
        let mut head_grad = group_grad(grads, hg, TextHead::ranges(&layout.groups[hg]))?;
        let mut gnorm = match head_grad.as_mut() {
            Some(g) => g.win(|r| &r.norm)?,
            None => scratch.dw_sink.view_mut(),
        };
        let (last, rstd, dxf) = (a.last().view(), a.rstd_f.view(), dxf.view());
        let mut dxv = dx.view_mut();
        ops::rmsnorm_backward(st, &mut dxv, &mut gnorm, &dxf, &last, &head.norm, &rstd, d)?;
    }
    drop(head_w);
    grads.release(hg)?;

    // dxf is spent: it holds each layer's input gradient in turn.
    let mut dprev = dxf;
    let mut visit = TextVisit::default();
    // Recompute runs layer forwards again: their working tensors (and, for the full
    // recompute, the layer's output, which nothing reads).
    let recomputes = a.layers.iter().any(|s| s.q_dropped() || s.ln1_dropped());
    let mut fwd = recomputes
        .then(|| FwdScratch::new(exec, &dims, n))
        .transpose()?;
    let mut rec_out = a
        .layers
        .iter()
        .any(LayerSaved::q_dropped)
        .then(|| exec.empty::<f32>(&[n, d]))
        .transpose()?;
    let pool = exec.host_pool();
    // Layer l's reload, queued while layer l+1's backward ran, and its copy mark.
    let mut next: Option<(Restored<A>, Option<CopyMark>)> = None;
    for l in (0..a.layers.len()).rev() {
        let _span = trace::span_at("text layer backward", l, Cat::Layer);
        let below_trains = (0..=l).any(|k| grads.trains(layout.text_layer(k)));
        if !below_trains && !want_dx0 {
            return Ok((None, visit));
        }
        let ctx = BlockCtx {
            dims,
            rope: &a.rope,
            pos: &a.pos,
            attention: seq_attention(exec, cp.zip(a.cp.as_ref()), &a.cu_seqlens),
        };
        let saved = &a.layers[l];
        let mut held = match next.take() {
            Some((h, mark)) => {
                if let (Some(p), Some(m)) = (pool, &mark) {
                    p.wait(st, m)?;
                }
                h
            }
            None => reload(exec, saved)?.0,
        };
        // Layer l-1's reload overlaps this layer's backward.
        if l > 0 && a.layers[l - 1].offloaded() {
            let (h, mark) = reload(exec, &a.layers[l - 1])?;
            next = Some((h, mark));
        }
        let g = layout.text_layer(l);
        let fetched = params.fetch(g)?;
        let w = TextLayer::split(fetched.view()?, &layout.groups[g])?.block();
        if let Some(s) = fwd.as_mut() {
            saved.recompute(exec, &mut held, &ctx, &w, s, rec_out.as_mut())?;
        }
        let gl = group_grad(grads, g, TextLayer::ranges(&layout.groups[g]).block())?;
        let (x, dout) = (saved.input(&held)?.view(), dx.view());
        let mut dxl = dprev.view_mut();
        block_backward(
            st,
            &ctx,
            &w,
            gl,
            saved.refs(&held)?,
            &mut scratch,
            &x,
            &dout,
            &mut dxl,
        )?;
        drop(held);
        drop(fetched);
        grads.release(g)?;
        std::mem::swap(&mut dx, &mut dprev);
        visit.layers += 1;
    }
    Ok((want_dx0.then_some(dx), visit))
}

/// Queues the reload of what `saved` offloaded, and marks it (None when nothing was).
fn reload<A: ActElem>(
    exec: &DeviceCtx,
    saved: &LayerSaved<A>,
) -> Result<(Restored<A>, Option<CopyMark>), ModelError> {
    let held = saved.reload(exec)?;
    let mark = match exec.host_pool().filter(|_| saved.offloaded()) {
        Some(p) => Some(p.mark()?),
        None => None,
    };
    Ok((held, mark))
}
