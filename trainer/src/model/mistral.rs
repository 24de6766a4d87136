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
//! sequences' ends (the batch's, [`crate::batch::Batch::sequence_ends`]), so no token sees
//! another sequence.

use super::block::{
    block_backward, block_forward, BlockActs, BlockCtx, BlockDims, BlockParams, BwdScratch,
    FwdScratch,
};
use super::config::{HiddenAct, Mistral3Config};
use super::exec::Exec;
use super::ops::{store, Act};
use super::params::{TextEmbed, TextHead, TextLayer};
use super::source::{group_grad, GradSink, GroupWeights, ParamSource};
use super::{head_view, ModelError};
use crate::cp::attn::{CpCtx, CpShapes};
use crate::cp::{CpGroup, CpLayout};
use cannon_kernels::rope::RopeTable;
use cannon_kernels::{ops, Tensor};
use cannon_runtime::BufferViewMut;

/// Everything the text forward saves (device tensors; positions, RoPE table and sequence
/// ends are host data the kernels take as such).
#[derive(Debug)]
pub struct TextActs<A: cannon_runtime::Element> {
    pub rope: RopeTable,
    /// `[T]` position id of every token (its RoPE slot).
    pub pos: Vec<u32>,
    /// Ends of the packed sequences: tokens never attend across them.
    pub cu_seqlens: Vec<usize>,
    pub x0: Tensor<f32>, // [T,D] spliced embeddings, the first block's input
    pub outs: Vec<Tensor<f32>>, // L x [T,D]: block l's output
    pub blocks: Vec<BlockActs<A>>,
    pub rstd_f: Tensor<f32>, // [T]
    pub xf: Tensor<A>,       // [T,D] final norm output (the lm_head's input)
    /// Under context parallelism: this rank's token layout (T above is then its Tl tokens,
    /// `cu_seqlens` the whole batch's).
    pub cp: Option<CpLayout>,
}

impl<A: cannon_runtime::Element> TextActs<A> {
    /// The decoder's last hidden state (the final norm's input).
    pub fn last(&self) -> &Tensor<f32> {
        self.outs.last().unwrap_or(&self.x0)
    }

    /// Tokens of the batch.
    pub fn tokens(&self) -> usize {
        self.pos.len()
    }

    fn input(&self, l: usize) -> &Tensor<f32> {
        match l {
            0 => &self.x0,
            _ => &self.outs[l - 1],
        }
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
    exec: &Exec,
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
    exec: &Exec,
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
/// `cu_seqlens`, see [`crate::batch::sequence_ends`]) to the final norm's output. Each layer's
/// group is fetched just before the layer runs and let go after it; the head group, fetched
/// for the final norm, is handed back for the lm_head.
pub fn forward<'p, A: Act>(
    exec: &Exec,
    cfg: &Mistral3Config,
    params: &'p dyn ParamSource,
    x0: Tensor<f32>,
    pos: Vec<u32>,
    cu_seqlens: Vec<usize>,
) -> Result<(TextActs<A>, GroupWeights<'p>), ModelError> {
    forward_cp(exec, cfg, params, x0, pos, cu_seqlens, None)
}

/// [`forward`] of a context-parallel rank (`cp` given): `x0 [Tl,D]` and `pos [Tl]` are this
/// rank's tokens of the layout, `cu_seqlens` the whole batch's sequence ends; attention
/// exchanges with the CP group ([`crate::cp`]).
pub fn forward_cp<'p, A: Act>(
    exec: &Exec,
    cfg: &Mistral3Config,
    params: &'p dyn ParamSource,
    x0: Tensor<f32>,
    pos: Vec<u32>,
    cu_seqlens: Vec<usize>,
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
    let mut scratch = FwdScratch::new(exec, &dims, n)?;
    let mut outs: Vec<Tensor<f32>> = Vec::with_capacity(t.num_hidden_layers);
    let mut blocks = Vec::with_capacity(t.num_hidden_layers);
    for l in 0..t.num_hidden_layers {
        let cpx = group.zip(cpl.as_ref()).map(|(group, layout)| CpCtx {
            exec,
            group,
            layout,
        });
        let ctx = BlockCtx {
            dims,
            rope: &rope,
            pos: &pos,
            cu_seqlens: &cu_seqlens,
            cp: cpx,
        };
        let mut acts = match &cpl {
            Some(l) => BlockActs::new_cp(exec, &dims, n, &CpShapes::new(&dims, l))?,
            None => BlockActs::new(exec, &dims, n)?,
        };
        let mut out = exec.empty(&[n, d])?;
        let g = layout.text_layer(l);
        let fetched = params.fetch(g)?;
        let w = TextLayer::split(fetched.view()?, &layout.groups[g])?.block();
        let x = outs.last().unwrap_or(&x0).view();
        block_forward(
            st,
            &ctx,
            &w,
            &mut acts,
            &mut scratch,
            &x,
            &mut out.view_mut(),
        )?;
        outs.push(out);
        blocks.push(acts);
    }
    drop(scratch);
    let head_w = params.fetch(layout.text_head())?;
    let head = head_view(layout, &head_w)?;
    let mut rstd_f = exec.empty(&[n])?;
    let mut xf = exec.empty(&[n, d])?;
    let mut xf32 = exec.empty::<f32>(&[n, d])?;
    let last = outs.last().unwrap_or(&x0).view();
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
        x0,
        outs,
        blocks,
        rstd_f,
        xf,
        cp: cpl,
    };
    Ok((acts, head_w))
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
#[allow(clippy::too_many_arguments)]
pub fn backward<A: Act>(
    exec: &Exec,
    cfg: &Mistral3Config,
    params: &dyn ParamSource,
    head_w: GroupWeights<'_>,
    a: &TextActs<A>,
    dxf: Tensor<f32>,
    grads: &mut dyn GradSink,
    want_dx0: bool,
) -> Result<(Option<Tensor<f32>>, TextVisit), ModelError> {
    backward_cp(exec, cfg, params, head_w, a, dxf, grads, want_dx0, None)
}

/// [`backward`] of a context-parallel rank: `cp` is the group the forward ran with.
#[allow(clippy::too_many_arguments)]
pub fn backward_cp<A: Act>(
    exec: &Exec,
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
    for l in (0..a.blocks.len()).rev() {
        let below_trains = (0..=l).any(|k| grads.trains(layout.text_layer(k)));
        if !below_trains && !want_dx0 {
            return Ok((None, visit));
        }
        let cpx = cp.zip(a.cp.as_ref()).map(|(group, layout)| CpCtx {
            exec,
            group,
            layout,
        });
        let ctx = BlockCtx {
            dims,
            rope: &a.rope,
            pos: &a.pos,
            cu_seqlens: &a.cu_seqlens,
            cp: cpx,
        };
        let g = layout.text_layer(l);
        let fetched = params.fetch(g)?;
        let w = TextLayer::split(fetched.view()?, &layout.groups[g])?.block();
        let gl = group_grad(grads, g, TextLayer::ranges(&layout.groups[g]).block())?;
        let (x, dout) = (a.input(l).view(), dx.view());
        let mut dxl = dprev.view_mut();
        block_backward(
            st,
            &ctx,
            &w,
            gl,
            &a.blocks[l],
            &mut scratch,
            &x,
            &dout,
            &mut dxl,
        )?;
        drop(fetched);
        grads.release(g)?;
        std::mem::swap(&mut dx, &mut dprev);
        visit.layers += 1;
    }
    Ok((want_dx0.then_some(dx), visit))
}
