//! The Mistral language model, forward and backward, and the splice of image features into
//! the [IMG] positions.
//!
//! ```text
//! x0      = embed_tokens[ids]                      [T,D]   T = B*S, rows of S tokens
//! x0[t]   = image_features[k]  for the k-th t with ids[t] == image_token_index
//! x_l+1   = block_l(x_l)                           GQA, causal within each row, 1-D RoPE
//! xf      = norm(x_L)                              [T,D]
//! logits  = xf lm_head^T                           [T,V]
//! ```

use super::block::{
    block_backward, block_forward, BlockActs, BlockCtx, BlockDims, BlockGrads, BlockScratch,
    BlockWeights,
};
use super::config::{GateAct, Mistral3Config};
use super::ops::{self, Precision, RopeTable};
use super::params::{Grads, Params, TextEmbed, TextHead, TextLayer};
use super::ModelError;

/// Everything the text forward saves.
#[derive(Clone, Debug)]
pub struct TextActs {
    pub rope: RopeTable,
    /// Row ends `[S, 2S, ..]`: rows never attend to each other.
    pub cu_seqlens: Vec<usize>,
    pub resid: Vec<Vec<f32>>, // L+1 x [T,D]: resid[0] = spliced embeddings
    pub blocks: Vec<BlockActs>,
    pub rstd_f: Vec<f32>, // [T]
    pub xf: Vec<f32>,     // [T,D]
    pub logits: Vec<f32>, // [T,V]
}

fn dims(cfg: &Mistral3Config) -> BlockDims {
    let t = &cfg.text_config;
    BlockDims {
        d: t.hidden_size,
        q_heads: t.num_attention_heads,
        kv_heads: t.num_key_value_heads,
        head_dim: t.head_dim(),
        inter: t.intermediate_size,
        causal: true,
        act: GateAct::Silu,
        eps: t.rms_norm_eps,
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

/// 1-D RoPE table `[rows*seq, Hd/2]` for positions 0..seq in every row (angles in f32, as
/// transformers computes them even for an f64 model).
fn rope_table(cfg: &Mistral3Config, rows: usize, seq: usize) -> RopeTable {
    let t = &cfg.text_config;
    let hd = t.head_dim();
    let half = hd / 2;
    let theta = t.rope_theta() as f32;
    let inv: Vec<f32> = (0..half)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / hd as f32))
        .collect();
    let mut angles = Vec::with_capacity(rows * seq * half);
    for _ in 0..rows {
        for pos in 0..seq {
            angles.extend(inv.iter().map(|&f| pos as f32 * f));
        }
    }
    RopeTable::from_angles(&angles, half)
}

/// `x0 [T,D]`: token embeddings with the image features spliced into the [IMG] positions.
pub fn embed(
    cfg: &Mistral3Config,
    params: &Params,
    ids: &[u32],
    image_features: &[f32],
) -> Result<Vec<f32>, ModelError> {
    let d = cfg.text_config.hidden_size;
    let vocab = cfg.text_config.vocab_size;
    let table = params.text_embed().embed;
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
    let mut feats = image_features.chunks_exact(d);
    for (row, &id) in x.chunks_exact_mut(d).zip(ids) {
        let src = if id == img {
            feats.next().unwrap_or(&[])
        } else if (id as usize) < vocab {
            &table[id as usize * d..][..d]
        } else {
            return Err(ModelError::Input(format!(
                "token id {id} is outside the vocabulary ({vocab})"
            )));
        };
        row.copy_from_slice(src);
    }
    Ok(x)
}

/// Backward of [`embed`]: text positions scatter-add into the embedding gradient (if it
/// trains); returns the gradient of the image features `[M,D]`, in [IMG] order.
pub fn embed_backward(
    cfg: &Mistral3Config,
    ids: &[u32],
    dx0: &[f32],
    dembed: Option<&mut [f32]>,
) -> Vec<f32> {
    let d = cfg.text_config.hidden_size;
    let img = cfg.image_token_index;
    let mut dfeat = Vec::new();
    let mut dembed = dembed;
    for (row, &id) in dx0.chunks_exact(d).zip(ids) {
        if id == img {
            dfeat.extend_from_slice(row);
        } else if let Some(de) = dembed.as_deref_mut() {
            for (o, &g) in de[id as usize * d..][..d].iter_mut().zip(row) {
                *o += g;
            }
        }
    }
    dfeat
}

/// Decoder forward from `x0 [rows*seq, D]` to the logits.
pub fn forward(
    cfg: &Mistral3Config,
    params: &Params,
    x0: Vec<f32>,
    rows: usize,
    seq: usize,
    prec: Precision,
) -> Result<TextActs, ModelError> {
    let t = &cfg.text_config;
    if let Some(w) = t.sliding_window {
        if seq > w {
            return Err(ModelError::Input(format!(
                "sequence length {seq} exceeds sliding_window {w} (windowed attention is not \
                 implemented)"
            )));
        }
    }
    let (d, v) = (t.hidden_size, t.vocab_size);
    let n = rows * seq;
    let dims = dims(cfg);
    let rope = rope_table(cfg, rows, seq);
    let cu_seqlens: Vec<usize> = (1..=rows).map(|r| r * seq).collect();
    let mut resid = vec![x0];
    let mut blocks = Vec::with_capacity(t.num_hidden_layers);
    for l in 0..t.num_hidden_layers {
        let ctx = BlockCtx {
            dims,
            rope: &rope,
            cu_seqlens: &cu_seqlens,
            prec,
        };
        let mut acts = BlockActs::new(&dims, n);
        let mut out = vec![0.0; n * d];
        block_forward(
            &ctx,
            &params.text_layer(l).block(),
            &mut acts,
            &resid[l],
            &mut out,
        )?;
        resid.push(out);
        blocks.push(acts);
    }
    let head = params.text_head();
    let mut xf = vec![0.0; n * d];
    let mut rstd_f = vec![0.0; n];
    let last = resid.last().map(Vec::as_slice).unwrap_or(&[]);
    ops::rmsnorm_forward(&mut xf, &mut rstd_f, last, head.norm, t.rms_norm_eps);
    prec.round(&mut xf);
    let mut logits = vec![0.0; n * v];
    ops::linear_forward(&mut logits, &xf, head.lm_head, d, v)?;
    Ok(TextActs {
        rope,
        cu_seqlens,
        resid,
        blocks,
        rstd_f,
        xf,
        logits,
    })
}

/// Decoder backward from `dlogits [T,V]`: accumulates into the text groups that train and,
/// when `want_dx0`, returns the gradient of `x0` (else stops below the lowest trained layer).
pub fn backward(
    cfg: &Mistral3Config,
    params: &Params,
    a: &TextActs,
    dlogits: &[f32],
    grads: &mut Grads,
    want_dx0: bool,
    prec: Precision,
) -> Result<Option<Vec<f32>>, ModelError> {
    let t = &cfg.text_config;
    let (d, v) = (t.hidden_size, t.vocab_size);
    let n = a.rstd_f.len();
    let layout = &params.layout;
    let head = params.text_head();
    let hg = layout.text_head();
    let mut gh = grads
        .group_mut(hg)
        .map(|buf| TextHead::split_mut(buf, &layout.groups[hg]));
    let mut dxf = vec![0.0; n * d];
    let glm = gh.as_mut().map(|g| &mut *g.lm_head);
    ops::linear_backward(Some(&mut dxf), glm, dlogits, &a.xf, head.lm_head, d, v)?;
    let mut dx = vec![0.0; n * d];
    let last = a.resid.last().map(Vec::as_slice).unwrap_or(&[]);
    ops::rmsnorm_backward(
        &mut dx,
        gh.map(|g| g.norm),
        &dxf,
        last,
        head.norm,
        &a.rstd_f,
    );

    let dims = dims(cfg);
    let mut scratch = BlockScratch::new(&dims, n);
    let mut dprev = vec![0.0; n * d];
    for l in (0..a.blocks.len()).rev() {
        let g = layout.text_layer(l);
        let trains = grads.data[g].is_some();
        let below_trains = (0..l).any(|k| grads.data[layout.text_layer(k)].is_some());
        if !trains && !below_trains && !want_dx0 {
            return Ok(None);
        }
        let ctx = BlockCtx {
            dims,
            rope: &a.rope,
            cu_seqlens: &a.cu_seqlens,
            prec,
        };
        let gl = grads
            .group_mut(g)
            .map(|buf| TextLayer::split_mut(buf, &layout.groups[g]).block());
        let w = params.text_layer(l);
        block_backward(
            &ctx,
            &w.block(),
            gl,
            &a.blocks[l],
            &a.resid[l],
            &dx,
            &mut dprev,
            &mut scratch,
        )?;
        std::mem::swap(&mut dx, &mut dprev);
    }
    Ok(Some(dx))
}

/// The embedding gradient view of `grads`, if the embedding trains.
pub fn embed_grad<'a>(params: &Params, grads: &'a mut Grads) -> Option<&'a mut [f32]> {
    let g = params.layout.text_embed();
    let layout = &params.layout.groups[g];
    grads
        .group_mut(g)
        .map(|buf| TextEmbed::split_mut(buf, layout).embed)
}
