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
    block_backward, block_forward, BlockActs, BlockCtx, BlockDims, BlockGrads, BlockScratch,
    BlockWeights,
};
use super::config::{HiddenAct, Mistral3Config};
use super::ops::{self, store, Act};
use super::params::{Grads, Params, TextEmbed, TextHead, TextLayer};
use super::ModelError;
use cannon_kernels::rope::RopeTable;
use cannon_kernels::{embedding, rmsnorm};

/// Everything the text forward saves.
#[derive(Clone, Debug)]
pub struct TextActs<A> {
    pub rope: RopeTable,
    /// `[T]` position id of every token (its RoPE slot).
    pub pos: Vec<u32>,
    /// Ends of the packed sequences: tokens never attend across them.
    pub cu_seqlens: Vec<usize>,
    pub resid: Vec<Vec<f32>>, // L+1 x [T,D]: resid[0] = spliced embeddings
    pub blocks: Vec<BlockActs<A>>,
    pub rstd_f: Vec<f32>, // [T]
    pub xf: Vec<A>,       // [T,D] final norm output (the lm_head's input)
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

impl<'a> TextLayer<&'a [f32]> {
    pub fn block(&self) -> BlockWeights<'a> {
        BlockWeights {
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

impl<'a> TextLayer<&'a mut [f32]> {
    pub fn block(self) -> BlockGrads<'a> {
        BlockGrads {
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

/// `x0 [T,D]`: token embeddings with the image features spliced into the `[IMG]` positions.
pub fn embed(
    cfg: &Mistral3Config,
    params: &Params,
    ids: &[u32],
    image_features: &[f32],
) -> Result<Vec<f32>, ModelError> {
    let d = cfg.text_config.hidden_size;
    let img = cfg.image_token_index;
    let slots = ids.iter().filter(|&&id| id == img).count();
    let features = image_features.len() / d;
    if slots != features {
        return Err(ModelError::ImageTokens {
            tokens: slots,
            features,
        });
    }
    let mut x = vec![0.0; ids.len() * d];
    embedding::embedding_forward(&mut x, ids, params.text_embed().embed, d)?;
    let rows = x.chunks_exact_mut(d).zip(ids).filter(|(_, &id)| id == img);
    for ((row, _), feat) in rows.zip(image_features.chunks_exact(d)) {
        row.copy_from_slice(feat);
    }
    Ok(x)
}

/// Backward of [`embed`]: takes the `[IMG]` rows out of `dx0 [T,D]` as the gradient of the image
/// features `[M,D]` (returned, in `[IMG]` order) and, if the embedding trains, scatter-adds the
/// text rows into its gradient (the `[IMG]` rows, zeroed, add nothing).
pub fn embed_backward(
    cfg: &Mistral3Config,
    ids: &[u32],
    dx0: &mut [f32],
    dembed: Option<&mut [f32]>,
) -> Result<Vec<f32>, ModelError> {
    let d = cfg.text_config.hidden_size;
    let img = cfg.image_token_index;
    let mut dfeat = Vec::new();
    for (row, _) in dx0
        .chunks_exact_mut(d)
        .zip(ids)
        .filter(|(_, &id)| id == img)
    {
        dfeat.extend_from_slice(row);
        row.fill(0.0);
    }
    if let Some(de) = dembed {
        embedding::embedding_backward(de, dx0, ids, d)?;
    }
    Ok(dfeat)
}

/// Decoder forward from `x0 [T,D]` (tokens at position ids `pos`, packed sequences ending at
/// `cu_seqlens`, see [`crate::batch::sequence_ends`]) to the final norm's output.
pub fn forward<A: Act>(
    cfg: &Mistral3Config,
    params: &Params,
    x0: Vec<f32>,
    pos: Vec<u32>,
    cu_seqlens: Vec<usize>,
) -> Result<TextActs<A>, ModelError> {
    let t = &cfg.text_config;
    if cu_seqlens.last() != Some(&pos.len()) || pos.len() * t.hidden_size != x0.len() {
        return Err(ModelError::Input(format!(
            "{} position ids, {} embedding values and sequences ending at {:?} disagree",
            pos.len(),
            x0.len(),
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
    let mut scratch = BlockScratch::<A>::new(&dims, n);
    let mut resid = vec![x0];
    let mut blocks = Vec::with_capacity(t.num_hidden_layers);
    for l in 0..t.num_hidden_layers {
        let ctx = BlockCtx {
            dims,
            rope: &rope,
            pos: &pos,
            cu_seqlens: &cu_seqlens,
        };
        let mut acts = BlockActs::new(&dims, n);
        let mut out = vec![0.0; n * d];
        let w = params.text_layer(l).block();
        block_forward(&ctx, &w, &mut acts, &mut scratch, &resid[l], &mut out)?;
        resid.push(out);
        blocks.push(acts);
    }
    let head = params.text_head();
    let mut xf32 = vec![0.0; n * d];
    let mut rstd_f = vec![0.0; n];
    let last = resid.last().map(Vec::as_slice).unwrap_or(&[]);
    rmsnorm::rmsnorm_forward(&mut xf32, &mut rstd_f, last, head.norm, d, dims.eps)?;
    let mut xf = ops::zeros::<A>(n * d);
    store(&xf32, &mut xf)?;
    Ok(TextActs {
        rope,
        pos,
        cu_seqlens,
        resid,
        blocks,
        rstd_f,
        xf,
    })
}

/// What the decoder backward did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TextVisit {
    /// Decoder layers whose backward ran (from the top).
    pub layers: usize,
}

/// Decoder backward from `dxf [T,D]` (the gradient of the final norm's output): accumulates
/// into the text groups that train and, when `want_dx0`, returns the gradient of `x0`. Layers
/// below the lowest trained one are not visited when `x0` needs no gradient.
pub fn backward<A: Act>(
    cfg: &Mistral3Config,
    params: &Params,
    a: &TextActs<A>,
    dxf: &[f32],
    grads: &mut Grads,
    want_dx0: bool,
) -> Result<(Option<Vec<f32>>, TextVisit), ModelError> {
    let t = &cfg.text_config;
    let d = t.hidden_size;
    let n = a.rstd_f.len();
    let layout = &params.layout;
    let head = params.text_head();
    let hg = layout.text_head();
    let dims = dims(cfg);
    let mut dx = vec![0.0; n * d];
    let mut sink = vec![0.0; d];
    let gnorm = grads
        .group_mut(hg)
        .map(|buf| TextHead::split_mut(buf, &layout.groups[hg]).norm)
        .unwrap_or(&mut sink[..]);
    let last = a.resid.last().map(Vec::as_slice).unwrap_or(&[]);
    rmsnorm::rmsnorm_backward(&mut dx, gnorm, dxf, last, head.norm, &a.rstd_f, d)?;

    let mut scratch = BlockScratch::<A>::new(&dims, n);
    let mut dprev = vec![0.0; n * d];
    let mut visit = TextVisit::default();
    for l in (0..a.blocks.len()).rev() {
        let below_trains = (0..=l).any(|k| grads.data[layout.text_layer(k)].is_some());
        if !below_trains && !want_dx0 {
            return Ok((None, visit));
        }
        let ctx = BlockCtx {
            dims,
            rope: &a.rope,
            pos: &a.pos,
            cu_seqlens: &a.cu_seqlens,
        };
        let g = layout.text_layer(l);
        let gl = grads
            .group_mut(g)
            .map(|buf| TextLayer::split_mut(buf, &layout.groups[g]).block());
        let w = params.text_layer(l).block();
        let x = &a.resid[l];
        block_backward(&ctx, &w, gl, &a.blocks[l], &mut scratch, x, &dx, &mut dprev)?;
        std::mem::swap(&mut dx, &mut dprev);
        visit.layers += 1;
    }
    Ok((want_dx0.then_some(dx), visit))
}

/// The embedding gradient view of `grads`, if the embedding trains.
pub fn embed_grad<'a>(params: &Params, grads: &'a mut Grads) -> Option<&'a mut [f32]> {
    let g = params.layout.text_embed();
    let layout = &params.layout.groups[g];
    grads
        .group_mut(g)
        .map(|buf| TextEmbed::split_mut(buf, layout).embed)
}
