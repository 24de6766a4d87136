//! Pixtral vision tower, forward and backward.
//!
//! ```text
//! pixel_values N x [C,h,w]                each image at its own size (`batch::Images`)
//! embed  = patch_conv(image)              [P,Dv]       per image (patch_embed kernel: im2col
//!                                                       + GEMM), patches row-major, images
//!                                                       concatenated
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
use super::ops::Act;
use super::params::{Grads, ParamLayout, Params, VisionEmbed, VisionLayer};
use super::{Images, ModelError};
use cannon_kernels::patch_embed::{PatchEmbedGrads, PatchGeom};
use cannon_kernels::rmsnorm;
use cannon_kernels::rope::RopeTable;
use cannon_kernels::KernelError;

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
        if img.pixel_values.len() != img.expected_len() {
            return Err(ModelError::Input(format!(
                "pixel_values hold {} values, {} images of {} channels at their sizes need {}",
                img.pixel_values.len(),
                img.len(),
                img.channels,
                img.expected_len()
            )));
        }
        let mut grids = Vec::with_capacity(img.len());
        let mut cu_seqlens = Vec::with_capacity(img.len());
        let mut total = 0;
        for (i, &(h, w)) in img.sizes.iter().enumerate() {
            if h < p || w < p {
                return Err(ModelError::Input(format!(
                    "image {i}: size {h}x{w} must be at least one {p}x{p} patch"
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

    /// Pixtral's 2-D RoPE: the axial table over the batch's largest grid (the first quarter
    /// of a head rotates by the patch row times the even-indexed frequencies, the second by
    /// the column times the odd-indexed ones, as transformers), and each patch's slot `[P]`.
    pub fn rope(&self, head_dim: usize, theta: f64) -> Result<(RopeTable, Vec<u32>), KernelError> {
        let rows = self.grids.iter().map(|g| g.0).max().unwrap_or(0);
        let cols = self.grids.iter().map(|g| g.1).max().unwrap_or(0);
        let table = RopeTable::axial(head_dim, theta, rows, cols)?;
        let mut pos = Vec::with_capacity(self.patches());
        for &(rows, cols) in &self.grids {
            for r in 0..rows {
                for c in 0..cols {
                    pos.push(table.axial_slot(r, c)?);
                }
            }
        }
        Ok((table, pos))
    }

    /// The kernel geometry of image `i` of `img`.
    fn geom(&self, img: &Images, i: usize, patch: usize) -> PatchGeom {
        let (h, w) = img.sizes[i];
        PatchGeom {
            channels: img.channels,
            height: h,
            width: w,
            h,
            w,
            patch,
        }
    }

    /// Patch range of image `i`.
    fn span(&self, i: usize) -> std::ops::Range<usize> {
        let start = if i == 0 { 0 } else { self.cu_seqlens[i - 1] };
        start..self.cu_seqlens[i]
    }
}

/// Everything the vision forward saves.
#[derive(Clone, Debug)]
pub struct PixtralActs<A> {
    pub grid: PatchGrid,
    pub rope: RopeTable,
    pub pos: Vec<u32>,        // [P] RoPE slot of each patch
    pub embed: Vec<f32>,      // [P, Dv] patch conv output
    pub rstd_pre: Vec<f32>,   // [P]
    pub resid: Vec<Vec<f32>>, // L+1 x [P, Dv]: resid[0] = ln_pre out, resid[l+1] = block l out
    pub blocks: Vec<BlockActs<A>>,
}

impl<A> PixtralActs<A> {
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
        act: v.hidden_act,
        eps: VISION_RMS_EPS as f32,
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
pub fn forward<A: Act>(
    cfg: &Mistral3Config,
    params: &Params,
    img: &Images,
) -> Result<PixtralActs<A>, ModelError> {
    let v = &cfg.vision_config;
    let grid = PatchGrid::new(cfg, img)?;
    let dv = v.hidden_size;
    let n = grid.patches();
    let dims = dims(cfg);
    let e = params.vision_embed();
    let mut embed = vec![0.0; n * dv];
    for i in 0..img.len() {
        let pixels = &img.pixel_values[img.range(i)];
        let out = &mut embed[grid.span(i).start * dv..grid.span(i).end * dv];
        A::patch_embed(
            out,
            pixels,
            e.patch_conv,
            grid.geom(img, i, v.patch_size),
            dv,
        )?;
    }
    let mut x0 = vec![0.0; n * dv];
    let mut rstd_pre = vec![0.0; n];
    rmsnorm::rmsnorm_forward(&mut x0, &mut rstd_pre, &embed, e.ln_pre, dv, dims.eps)?;

    let (rope, pos) = grid.rope(v.head_dim(), v.rope_theta())?;
    let layers = cfg.vision_layers_used();
    let mut scratch = BlockScratch::<A>::new(&dims, n);
    let mut resid = vec![x0];
    let mut blocks = Vec::with_capacity(layers);
    for l in 0..layers {
        let ctx = BlockCtx {
            dims,
            rope: &rope,
            pos: &pos,
            cu_seqlens: &grid.cu_seqlens,
        };
        let mut acts = BlockActs::new(&dims, n);
        let mut out = vec![0.0; n * dv];
        let w = params.vision_layer(l).block();
        block_forward(&ctx, &w, &mut acts, &mut scratch, &resid[l], &mut out)?;
        resid.push(out);
        blocks.push(acts);
    }
    Ok(PixtralActs {
        grid,
        rope,
        pos,
        embed,
        rstd_pre,
        resid,
        blocks,
    })
}

/// What the vision backward did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VisionVisit {
    /// Pixtral layers whose backward ran.
    pub layers: usize,
    /// Whether the patch embedding's backward ran.
    pub patch_embed: bool,
}

/// Pixtral backward from `dout [P, Dv]` (the gradient of [`PixtralActs::output`]): accumulates
/// into the vision groups of `grads` that exist (frozen ones are skipped) and, when
/// `dpixels` is given, into the pixel gradient (laid out like `Images::pixel_values`).
pub fn backward<A: Act>(
    cfg: &Mistral3Config,
    params: &Params,
    a: &PixtralActs<A>,
    img: &Images,
    dout: &[f32],
    grads: &mut Grads,
    mut dpixels: Option<&mut [f32]>,
) -> Result<VisionVisit, ModelError> {
    let v = &cfg.vision_config;
    let dv = v.hidden_size;
    if let Some(dp) = dpixels.as_deref() {
        if dp.len() != img.pixel_values.len() {
            return Err(ModelError::Input(format!(
                "the pixel gradient holds {} values, the images {}",
                dp.len(),
                img.pixel_values.len()
            )));
        }
    }
    let n = a.grid.patches();
    let dims = dims(cfg);
    let layout: &ParamLayout = &params.layout;
    let mut scratch = BlockScratch::<A>::new(&dims, n);
    let mut d = dout.to_vec();
    let mut dprev = vec![0.0; n * dv];
    let mut visit = VisionVisit::default();
    for l in (0..a.blocks.len()).rev() {
        let ctx = BlockCtx {
            dims,
            rope: &a.rope,
            pos: &a.pos,
            cu_seqlens: &a.grid.cu_seqlens,
        };
        let g = layout.vision_layer(l);
        let gl = grads
            .group_mut(g)
            .map(|buf| VisionLayer::split_mut(buf, &layout.groups[g]).block());
        let w = params.vision_layer(l).block();
        let x = &a.resid[l];
        block_backward(&ctx, &w, gl, &a.blocks[l], &mut scratch, x, &d, &mut dprev)?;
        std::mem::swap(&mut d, &mut dprev);
        visit.layers += 1;
    }
    // x0 = ln_pre(embed); embed = patch_conv(pixels)
    let e = params.vision_embed();
    let g = ParamLayout::VISION_EMBED;
    let mut ge = grads
        .group_mut(g)
        .map(|buf| VisionEmbed::split_mut(buf, &layout.groups[g]));
    if ge.is_none() && dpixels.is_none() {
        return Ok(visit);
    }
    let mut dembed = vec![0.0; n * dv];
    let mut sink = vec![0.0; dv];
    let gln = ge.as_mut().map_or(&mut sink[..], |g| &mut *g.ln_pre);
    rmsnorm::rmsnorm_backward(&mut dembed, gln, &d, &a.embed, e.ln_pre, &a.rstd_pre, dv)?;
    let mut gconv = ge.map(|g| g.patch_conv);
    for i in 0..img.len() {
        let span = a.grid.span(i);
        let range = img.range(i);
        let grads = PatchEmbedGrads {
            dweight: gconv.as_deref_mut(),
            dpixels: dpixels.as_deref_mut().map(|dp| &mut dp[range.clone()]),
        };
        let dout = &dembed[span.start * dv..span.end * dv];
        let geom = a.grid.geom(img, i, v.patch_size);
        A::patch_embed_back(
            grads,
            dout,
            &img.pixel_values[range],
            e.patch_conv,
            geom,
            dv,
        )?;
    }
    visit.patch_embed = true;
    Ok(visit)
}
