//! Pixtral vision tower, forward and backward.
//!
//! ```text
//! pixel_values [N,C,Hmax,Wmax] -> patches [P, C*p*p]   each image cropped to its own size,
//!                                                       patches row-major, images concatenated
//! embed  = patches Wconv^T                [P,Dv]       the stride-p conv as a GEMM
//! x0     = ln_pre(embed)                  [P,Dv]
//! x_l+1  = block_l(x_l)                   [P,Dv]       attention block-diagonal per image
//! out    = x_L                                          L = layers used (vision_feature_layer)
//! ```
//!
//! The image boundaries (`cu_seqlens`, cumulative patch counts) and the 2-D RoPE positions
//! (row, col inside each image) come from `image_sizes` alone, before any patch merging, so
//! no token of one image ever meets a token of another.

use super::block::{
    block_backward, block_forward, BlockActs, BlockCtx, BlockDims, BlockGrads, BlockScratch,
    BlockWeights,
};
use super::config::{Mistral3Config, VISION_RMS_EPS};
use super::ops::{self, Precision, RopeTable};
use super::params::{Grads, ParamLayout, Params, VisionEmbed, VisionLayer};
use super::ModelError;

/// A batch of images: `pixel_values [N, C, H, W]` zero padded to the largest image, and each
/// image's `(height, width)` in pixels.
#[derive(Clone, Debug, Default)]
pub struct Images {
    pub pixel_values: Vec<f32>,
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    pub sizes: Vec<(usize, usize)>,
}

impl Images {
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    /// Elements of one padded image.
    pub fn image_len(&self) -> usize {
        self.channels * self.height * self.width
    }
}

/// The patch grid of every image: `(rows, cols)` of patches and the cumulative patch ends.
#[derive(Clone, Debug)]
pub struct PatchGrid {
    pub grids: Vec<(usize, usize)>,
    pub cu_seqlens: Vec<usize>,
}

impl PatchGrid {
    /// Checks the images against the config and derives the grid from `image_sizes`.
    pub fn new(cfg: &Mistral3Config, img: &Images) -> Result<Self, ModelError> {
        let v = &cfg.vision_config;
        let p = v.patch_size;
        if img.channels != v.num_channels {
            return Err(ModelError::Input(format!(
                "pixel_values have {} channels, the vision tower takes {}",
                img.channels, v.num_channels
            )));
        }
        if img.pixel_values.len() != img.len() * img.image_len() {
            return Err(ModelError::Input(format!(
                "pixel_values hold {} values, {} images of [{}, {}, {}] need {}",
                img.pixel_values.len(),
                img.len(),
                img.channels,
                img.height,
                img.width,
                img.len() * img.image_len()
            )));
        }
        let mut grids = Vec::with_capacity(img.len());
        let mut cu_seqlens = Vec::with_capacity(img.len());
        let mut total = 0;
        for (i, &(h, w)) in img.sizes.iter().enumerate() {
            if h > img.height || w > img.width || h < p || w < p {
                return Err(ModelError::Input(format!(
                    "image {i}: size {h}x{w} must be at least one {p}x{p} patch and fit the \
                     padded {}x{} pixel_values",
                    img.height, img.width
                )));
            }
            grids.push((h / p, w / p));
            total += (h / p) * (w / p);
            cu_seqlens.push(total);
        }
        Ok(PatchGrid { grids, cu_seqlens })
    }

    pub fn patches(&self) -> usize {
        self.cu_seqlens.last().copied().unwrap_or(0)
    }

    /// 2-D RoPE table `[P, Hd/2]`: the first quarter of the head rotates by the patch row times
    /// the even-indexed frequencies, the second by the column times the odd-indexed ones
    /// (transformers' axial RoPE; angles in f32 as there).
    pub fn rope(&self, head_dim: usize, theta: f64) -> RopeTable {
        let half = head_dim / 2;
        let inv: Vec<f32> = (0..half)
            .map(|k| 1.0 / (theta as f32).powf((2 * k) as f32 / head_dim as f32))
            .collect();
        let mut angles = Vec::with_capacity(self.patches() * half);
        for &(rows, cols) in &self.grids {
            for r in 0..rows {
                for c in 0..cols {
                    angles.extend(inv.iter().step_by(2).map(|&f| r as f32 * f));
                    angles.extend(inv.iter().skip(1).step_by(2).map(|&f| c as f32 * f));
                }
            }
        }
        RopeTable::from_angles(&angles, half)
    }
}

/// Everything the vision forward saves.
#[derive(Clone, Debug)]
pub struct PixtralActs {
    pub grid: PatchGrid,
    pub rope: RopeTable,
    pub patches: Vec<f32>,    // [P, C*p*p]
    pub embed: Vec<f32>,      // [P, Dv]
    pub rstd_pre: Vec<f32>,   // [P]
    pub resid: Vec<Vec<f32>>, // L+1 x [P, Dv]: resid[0] = ln_pre out, resid[l+1] = block l out
    pub blocks: Vec<BlockActs>,
}

impl PixtralActs {
    /// The tower's output `[P, Dv]` (the hidden state `vision_feature_layer` selects).
    pub fn output(&self) -> &[f32] {
        self.resid.last().map(Vec::as_slice).unwrap_or(&[])
    }
}

fn dims(cfg: &Mistral3Config) -> BlockDims {
    let v = &cfg.vision_config;
    BlockDims {
        d: v.hidden_size,
        q_heads: v.num_attention_heads,
        kv_heads: v.num_attention_heads,
        head_dim: v.head_dim(),
        inter: v.intermediate_size,
        causal: false,
        act: v.gate_act(),
        eps: VISION_RMS_EPS,
    }
}

impl<'a> VisionLayer<&'a [f32]> {
    pub fn block(&self) -> BlockWeights<'a> {
        BlockWeights {
            attn_norm: self.attn_norm,
            q: self.q,
            k: self.k,
            v: self.v,
            o: self.o,
            mlp_norm: self.ffn_norm,
            gate: self.gate,
            up: self.up,
            down: self.down,
        }
    }
}

impl<'a> VisionLayer<&'a mut [f32]> {
    pub fn block(self) -> BlockGrads<'a> {
        BlockGrads {
            attn_norm: self.attn_norm,
            q: self.q,
            k: self.k,
            v: self.v,
            o: self.o,
            mlp_norm: self.ffn_norm,
            gate: self.gate,
            up: self.up,
            down: self.down,
        }
    }
}

/// Pixtral forward over all images of the batch.
pub fn forward(
    cfg: &Mistral3Config,
    params: &Params,
    img: &Images,
    prec: Precision,
) -> Result<PixtralActs, ModelError> {
    let v = &cfg.vision_config;
    let grid = PatchGrid::new(cfg, img)?;
    let (p, dv) = (v.patch_size, v.hidden_size);
    let kdim = v.num_channels * p * p;
    let n = grid.patches();
    let dims = dims(cfg);
    let layers = cfg.vision_layers_used();

    // im2col: patch vector index (c*p + ky)*p + kx, matching Wconv [Dv, C, p, p].
    let mut patches = vec![0.0f32; n * kdim];
    let mut rows = patches.chunks_exact_mut(kdim);
    for (i, &(gh, gw)) in grid.grids.iter().enumerate() {
        let image = &img.pixel_values[i * img.image_len()..][..img.image_len()];
        for r in 0..gh {
            for c in 0..gw {
                let Some(row) = rows.next() else { break };
                for (ch, plane) in image.chunks_exact(img.height * img.width).enumerate() {
                    for ky in 0..p {
                        let src = &plane[(r * p + ky) * img.width + c * p..][..p];
                        row[(ch * p + ky) * p..][..p].copy_from_slice(src);
                    }
                }
            }
        }
    }
    prec.round(&mut patches);
    let e = params.vision_embed();
    let mut embed = vec![0.0; n * dv];
    ops::linear_forward(&mut embed, &patches, e.patch_conv, kdim, dv)?;
    let mut x0 = vec![0.0; n * dv];
    let mut rstd_pre = vec![0.0; n];
    ops::rmsnorm_forward(&mut x0, &mut rstd_pre, &embed, e.ln_pre, VISION_RMS_EPS);

    let rope = grid.rope(v.head_dim(), v.rope_theta());
    let mut resid = vec![x0];
    let mut blocks = Vec::with_capacity(layers);
    for l in 0..layers {
        let ctx = BlockCtx {
            dims,
            rope: &rope,
            cu_seqlens: &grid.cu_seqlens,
            prec,
        };
        let mut acts = BlockActs::new(&dims, n);
        let mut out = vec![0.0; n * dv];
        block_forward(
            &ctx,
            &params.vision_layer(l).block(),
            &mut acts,
            &resid[l],
            &mut out,
        )?;
        resid.push(out);
        blocks.push(acts);
    }
    Ok(PixtralActs {
        grid,
        rope,
        patches,
        embed,
        rstd_pre,
        resid,
        blocks,
    })
}

/// Pixtral backward from `dout [P, Dv]` (the gradient of [`PixtralActs::output`]): accumulates
/// into the vision groups of `grads` that exist (frozen ones are skipped) and, when
/// `dpixels` is given, into the pixel gradient `[N, C, H, W]` (padding gets none).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    cfg: &Mistral3Config,
    params: &Params,
    a: &PixtralActs,
    img: &Images,
    dout: &[f32],
    grads: &mut Grads,
    dpixels: Option<&mut [f32]>,
    prec: Precision,
) -> Result<(), ModelError> {
    let v = &cfg.vision_config;
    let (p, dv) = (v.patch_size, v.hidden_size);
    let kdim = v.num_channels * p * p;
    let n = a.grid.patches();
    let dims = dims(cfg);
    let layout: &ParamLayout = &params.layout;
    let mut scratch = BlockScratch::new(&dims, n);
    let mut d = dout.to_vec();
    let mut dprev = vec![0.0; n * dv];
    for l in (0..a.blocks.len()).rev() {
        let ctx = BlockCtx {
            dims,
            rope: &a.rope,
            cu_seqlens: &a.grid.cu_seqlens,
            prec,
        };
        let g = layout.vision_layer(l);
        let gl = grads
            .group_mut(g)
            .map(|buf| VisionLayer::split_mut(buf, &layout.groups[g]).block());
        let w = params.vision_layer(l);
        block_backward(
            &ctx,
            &w.block(),
            gl,
            &a.blocks[l],
            &a.resid[l],
            &d,
            &mut dprev,
            &mut scratch,
        )?;
        std::mem::swap(&mut d, &mut dprev);
    }
    // x0 = ln_pre(embed); embed = patches Wconv^T
    let e = params.vision_embed();
    let g = ParamLayout::VISION_EMBED;
    let mut ge = grads
        .group_mut(g)
        .map(|buf| VisionEmbed::split_mut(buf, &layout.groups[g]));
    let mut dembed = vec![0.0; n * dv];
    let gln = ge.as_mut().map(|g| &mut *g.ln_pre);
    ops::rmsnorm_backward(&mut dembed, gln, &d, &a.embed, e.ln_pre, &a.rstd_pre);
    let gconv = ge.map(|g| g.patch_conv);
    let Some(dpix) = dpixels else {
        ops::linear_backward(None, gconv, &dembed, &a.patches, e.patch_conv, kdim, dv)?;
        return Ok(());
    };
    let mut dpatches = vec![0.0; n * kdim];
    ops::linear_backward(
        Some(&mut dpatches),
        gconv,
        &dembed,
        &a.patches,
        e.patch_conv,
        kdim,
        dv,
    )?;
    // col2im: the inverse of the patch gather in `forward` (patches do not overlap).
    let mut rows = dpatches.chunks_exact(kdim);
    for (i, &(gh, gw)) in a.grid.grids.iter().enumerate() {
        let image = &mut dpix[i * img.image_len()..][..img.image_len()];
        for r in 0..gh {
            for c in 0..gw {
                let Some(row) = rows.next() else { break };
                for (ch, plane) in image.chunks_exact_mut(img.height * img.width).enumerate() {
                    for ky in 0..p {
                        let dst = &mut plane[(r * p + ky) * img.width + c * p..][..p];
                        for (o, &g) in dst.iter_mut().zip(&row[(ch * p + ky) * p..][..p]) {
                            *o += g;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}
