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
//! The pixels are uploaded once and saved (the patch conv's backward reads them); every
//! activation is a device tensor. The image boundaries (`cu_seqlens`, cumulative patch counts) and the 2-D RoPE positions
//! (row, col inside each image) come from `image_sizes` alone, before any patch merging, so
//! no token of one image ever meets a token of another.

use super::block::{
    block_forward, BlockActs, BlockCtx, BlockDims, BlockGrads, BlockParams, BlockWeights,
    FwdScratch,
};
use super::block_backward::{block_backward, BwdScratch};
use super::config::{Mistral3Config, VISION_RMS_EPS};
use super::params::{ParamLayout, VisionEmbed, VisionLayer};
use super::precision::ActElem;
use super::precision::{patch_embed, patch_embed_back};
use super::source::{group_grad, GradSink, ParamSource};
use super::{Images, ModelError};
use crate::parallel::cp::attn::SeqAttention;
use cannon_kernels::device_ctx::DeviceCtx;
use cannon_kernels::ops;
use cannon_kernels::patch_embed::{PatchEmbedGradBufs, PatchGeom};
use cannon_kernels::rope::RopeTable;
use cannon_kernels::{KernelError, Tensor};
use cannon_runtime::trace::{self, Cat};

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

/// Everything the vision forward saves (device tensors; the grid, RoPE table and slots are
/// host data the kernels take as such).
#[derive(Debug)]
pub struct PixtralActs<A: cannon_runtime::Element> {
    pub grid: PatchGrid,
    pub rope: RopeTable,
    pub pos: Vec<u32>,          // [P] RoPE slot of each patch
    pub pixels: Tensor<f32>,    // [N, C, H, W] the uploaded pixel_values
    pub embed: Tensor<f32>,     // [P, Dv] patch conv output
    pub rstd_pre: Tensor<f32>,  // [P]
    pub x0: Tensor<f32>,        // [P, Dv] ln_pre output, the first block's input
    pub outs: Vec<Tensor<f32>>, // L x [P, Dv]: block l's output
    pub blocks: Vec<BlockActs<A>>,
}

impl<A: cannon_runtime::Element> PixtralActs<A> {
    /// The tower's output `[P, Dv]` (the hidden state `vision_feature_layer` selects).
    pub fn output(&self) -> &Tensor<f32> {
        self.outs.last().unwrap_or(&self.x0)
    }

    /// The input of block `l`.
    fn input(&self, l: usize) -> &Tensor<f32> {
        match l {
            0 => &self.x0,
            _ => &self.outs[l - 1],
        }
    }
}

pub(crate) fn dims(cfg: &Mistral3Config) -> BlockDims {
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

impl<T> VisionLayer<T> {
    /// The layer's tensors in block order.
    pub fn block(self) -> BlockParams<T> {
        BlockParams {
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
pub fn forward<A: ActElem>(
    exec: &DeviceCtx,
    cfg: &Mistral3Config,
    params: &dyn ParamSource,
    img: &Images,
) -> Result<PixtralActs<A>, ModelError> {
    let st = exec.stream();
    let v = &cfg.vision_config;
    let grid = PatchGrid::new(cfg, img)?;
    let dv = v.hidden_size;
    let n = grid.patches();
    let dims = dims(cfg);
    let layout = params.layout();
    let eg = ParamLayout::VISION_EMBED;
    let fetched = params.fetch(eg)?;
    let e = VisionEmbed::split(fetched.view()?, &layout.groups[eg])?;
    let pixels = exec.upload(&img.pixel_values, &[img.pixel_values.len()])?;
    let mut embed = exec.empty(&[n, dv])?;
    for i in 0..img.len() {
        let mut out = embed.rows_mut(grid.span(i))?;
        let geom = grid.geom(img, i, v.patch_size);
        let px = pixels.view().slice(img.range(i))?; // [C, h, w]
        patch_embed::<A>(st, &mut out, &px, &e.patch_conv, geom, dv)?;
    }
    let mut x0 = exec.empty(&[n, dv])?;
    let mut rstd_pre = exec.empty(&[n])?;
    let (mut xv, mut rv) = (x0.view_mut(), rstd_pre.view_mut());
    ops::rmsnorm_forward(st, &mut xv, &mut rv, &embed.view(), &e.ln_pre, dv, dims.eps)?;
    drop(fetched);

    let (rope, pos) = grid.rope(v.head_dim(), v.rope_theta())?;
    let layers = cfg.vision_layers_used();
    let mut scratch = FwdScratch::new(exec, &dims, n)?;
    let mut outs: Vec<Tensor<f32>> = Vec::with_capacity(layers);
    let mut blocks = Vec::with_capacity(layers);
    for l in 0..layers {
        let _span = trace::span_at("vision layer forward", l, Cat::Layer);
        let ctx = BlockCtx {
            dims,
            rope: &rope,
            pos: &pos,
            attention: SeqAttention::Local {
                cu_seqlens: &grid.cu_seqlens,
            },
        };
        let mut acts = BlockActs::new(exec, &dims, n)?;
        let mut out = exec.empty(&[n, dv])?;
        let g = layout.vision_layer(l);
        let fetched = params.fetch(g)?;
        let w = VisionLayer::split(fetched.view()?, &layout.groups[g])?.block();
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
        drop(fetched);
        outs.push(out);
        blocks.push(acts);
    }
    Ok(PixtralActs {
        grid,
        rope,
        pos,
        pixels,
        embed,
        rstd_pre,
        x0,
        outs,
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

/// Pixtral backward from `dout [P, Dv]` (the gradient of [`PixtralActs::output`], consumed):
/// accumulates into the vision groups of `grads` that exist (frozen ones are skipped) and,
/// when `dpixels` is given, into the pixel gradient (laid out like `Images::pixel_values`).
#[allow(clippy::too_many_arguments)]
pub fn backward<A: ActElem>(
    exec: &DeviceCtx,
    cfg: &Mistral3Config,
    params: &dyn ParamSource,
    a: &PixtralActs<A>,
    img: &Images,
    dout: Tensor<f32>,
    grads: &mut dyn GradSink,
    mut dpixels: Option<&mut Tensor<f32>>,
) -> Result<VisionVisit, ModelError> {
    let st = exec.stream();
    let v = &cfg.vision_config;
    let dv = v.hidden_size;
    let n = a.grid.patches();
    let dims = dims(cfg);
    let layout: &ParamLayout = params.layout();
    if let Some(dp) = &dpixels {
        if dp.numel() != img.pixel_values.len() {
            return Err(ModelError::Input(format!(
                "the pixel gradient holds {} values, the images {}",
                dp.numel(),
                img.pixel_values.len()
            )));
        }
    }
    let mut scratch = BwdScratch::<A>::new(exec, &dims, n)?;
    let mut d = dout;
    let mut dprev = exec.empty(&[n, dv])?;
    let mut visit = VisionVisit::default();
    for l in (0..a.blocks.len()).rev() {
        let _span = trace::span_at("vision layer backward", l, Cat::Layer);
        let ctx = BlockCtx {
            dims,
            rope: &a.rope,
            pos: &a.pos,
            attention: SeqAttention::Local {
                cu_seqlens: &a.grid.cu_seqlens,
            },
        };
        let g = layout.vision_layer(l);
        let fetched = params.fetch(g)?;
        let w: BlockWeights = VisionLayer::split(fetched.view()?, &layout.groups[g])?.block();
        let at = VisionLayer::ranges(&layout.groups[g]).block();
        let gl: Option<BlockGrads> = group_grad(grads, g, at)?;
        let (x, dv_) = (a.input(l).view(), d.view());
        let mut dx = dprev.view_mut();
        block_backward(
            st,
            &ctx,
            &w,
            gl,
            a.blocks[l].refs(),
            &mut scratch,
            &x,
            &dv_,
            &mut dx,
        )?;
        drop(fetched);
        grads.release(g)?;
        std::mem::swap(&mut d, &mut dprev);
        visit.layers += 1;
    }
    // x0 = ln_pre(embed); embed = patch_conv(pixels)
    let g = ParamLayout::VISION_EMBED;
    if !grads.trains(g) && dpixels.is_none() {
        return Ok(visit);
    }
    drop(dprev);
    let fetched = params.fetch(g)?;
    let e = VisionEmbed::split(fetched.view()?, &layout.groups[g])?;
    let at = VisionEmbed::ranges(&layout.groups[g]);
    let mut ge = group_grad(grads, g, at)?;
    let mut dembed = exec.zeros(&[n, dv])?;
    let mut gln = match ge.as_mut() {
        Some(ge) => ge.win(|r| &r.ln_pre)?,
        None => scratch.dw_sink.view_mut(),
    };
    let (dd, embed, rstd) = (d.view(), a.embed.view(), a.rstd_pre.view());
    let mut de = dembed.view_mut();
    ops::rmsnorm_backward(st, &mut de, &mut gln, &dd, &embed, &e.ln_pre, &rstd, dv)?;
    for i in 0..img.len() {
        let span = a.grid.span(i);
        let grads = PatchEmbedGradBufs {
            dweight: ge.as_mut().map(|g| g.win(|r| &r.patch_conv)).transpose()?,
            dpixels: dpixels
                .as_deref_mut()
                .map(|dp| dp.buffer_mut().slice_mut(img.range(i)))
                .transpose()?,
        };
        let dout = dembed.rows(span)?;
        let geom = a.grid.geom(img, i, v.patch_size);
        let pixels = a.pixels.view().slice(img.range(i))?; // [C, h, w]
        patch_embed_back::<A>(st, grads, &dout, &pixels, &e.patch_conv, geom, dv)?;
    }
    drop(dembed);
    drop(fetched);
    grads.release(g)?;
    visit.patch_embed = true;
    Ok(visit)
}
