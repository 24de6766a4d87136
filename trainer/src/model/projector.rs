//! The Mistral3 multimodal projector, forward and backward.
//!
//! ```text
//! x       [P, Dv]       vision tower output, all images' patches
//! xn      = rmsnorm(x)          [P, Dv]  (eps = text rms_norm_eps)
//! merged  [M, Dv*m*m]   per image: each m x m block of patches -> one token, row-major over
//!                       the (rows/m) x (cols/m) grid (odd rows/cols dropped), feature index
//!                       c*m*m + di*m + dj (torch.nn.functional.unfold's channel-major order)
//! h0      = merged Wmerge^T     [M, Dv]
//! h1      = h0 W1^T             [M, D]
//! out     = gelu(h1) W2^T       [M, D]   one row per [IMG] token, images in order
//! ```

use super::config::Mistral3Config;
use super::ops::{self, linear, linear_back, store, Act};
use super::params::{Grads, Params, Projector};
use super::pixtral::PatchGrid;
use cannon_kernels::{gelu, rmsnorm, KernelError};

/// Everything the projector forward saves.
#[derive(Clone, Debug)]
pub struct ProjectorActs<A> {
    /// `sources[t*m*m + di*m + dj]` = the patch merged into token t at block offset (di, dj).
    pub sources: Vec<usize>,
    pub rstd: Vec<f32>, // [P]
    pub merged: Vec<A>, // [M, Dv*m*m]  norm output, gathered
    pub h0: Vec<A>,     // [M, Dv]
    pub h1: Vec<f32>,   // [M, D]
    pub act: Vec<A>,    // [M, D]  gelu(h1)
    pub out: Vec<f32>,  // [M, D]
}

/// Merged tokens per image, in order (`(rows/m) * (cols/m)`).
pub fn tokens_per_image(grid: &PatchGrid, m: usize) -> Vec<usize> {
    grid.grids.iter().map(|&(r, c)| (r / m) * (c / m)).collect()
}

/// The patch merger's gather map (see [`ProjectorActs::sources`]).
fn merge_sources(grid: &PatchGrid, m: usize) -> Vec<usize> {
    let mut sources = Vec::new();
    let mut base = 0;
    for &(rows, cols) in &grid.grids {
        for r in 0..rows / m {
            for c in 0..cols / m {
                for di in 0..m {
                    for dj in 0..m {
                        sources.push(base + (r * m + di) * cols + c * m + dj);
                    }
                }
            }
        }
        base += rows * cols;
    }
    sources
}

/// Projector forward from the vision output `x [P, Dv]`.
pub fn forward<A: Act>(
    cfg: &Mistral3Config,
    params: &Params,
    grid: &PatchGrid,
    x: &[f32],
) -> Result<ProjectorActs<A>, KernelError> {
    let dv = cfg.vision_config.hidden_size;
    let d = cfg.text_config.hidden_size;
    let m = cfg.spatial_merge_size;
    let mm = m * m;
    let w = params.projector();
    let p = x.len() / dv.max(1);
    let eps = cfg.text_config.rms_norm_eps as f32;
    let mut rstd = vec![0.0; p];
    let mut xn = vec![0.0; p * dv];
    rmsnorm::rmsnorm_forward(&mut xn, &mut rstd, x, w.norm, dv, eps)?;

    let sources = merge_sources(grid, m);
    let tokens = sources.len() / mm;
    let mut merged32 = vec![0.0; tokens * dv * mm];
    for (row, src) in merged32
        .chunks_exact_mut(dv * mm)
        .zip(sources.chunks_exact(mm))
    {
        for (q, &s) in src.iter().enumerate() {
            for (c, &v) in xn[s * dv..][..dv].iter().enumerate() {
                row[c * mm + q] = v;
            }
        }
    }
    let mut merged = ops::zeros::<A>(merged32.len());
    store(&merged32, &mut merged)?;
    let mut h = vec![0.0; tokens * dv];
    linear(&mut h, &merged, w.merge, dv * mm, dv)?;
    let mut h0 = ops::zeros::<A>(h.len());
    store(&h, &mut h0)?;
    let mut h1 = vec![0.0; tokens * d];
    linear(&mut h1, &h0, w.linear_1, dv, d)?;
    let mut g = vec![0.0; tokens * d];
    gelu::gelu_forward(&mut g, &h1)?;
    let mut act = ops::zeros::<A>(g.len());
    store(&g, &mut act)?;
    let mut out = vec![0.0; tokens * d];
    linear(&mut out, &act, w.linear_2, d, d)?;
    Ok(ProjectorActs {
        sources,
        rstd,
        merged,
        h0,
        h1,
        act,
        out,
    })
}

/// Projector backward from `dout [M, D]`: accumulates the projector's weight gradients if its
/// group trains, and when `dx` is given accumulates the gradient of the vision output into it.
pub fn backward<A: Act>(
    cfg: &Mistral3Config,
    params: &Params,
    a: &ProjectorActs<A>,
    x: &[f32],
    dout: &[f32],
    grads: &mut Grads,
    dx: Option<&mut [f32]>,
) -> Result<(), KernelError> {
    let dv = cfg.vision_config.hidden_size;
    let d = cfg.text_config.hidden_size;
    let mm = cfg.spatial_merge_size * cfg.spatial_merge_size;
    let tokens = a.sources.len() / mm.max(1);
    let w = params.projector();
    let gi = params.layout.projector();
    let mut g = grads
        .group_mut(gi)
        .map(|buf| Projector::split_mut(buf, &params.layout.groups[gi]));

    let mut dact = vec![0.0; tokens * d];
    let g2 = g.as_mut().map(|g| &mut *g.linear_2);
    linear_back(Some(&mut dact), g2, dout, &a.act, w.linear_2, d, d)?;
    let mut dh1 = vec![0.0; tokens * d];
    gelu::gelu_backward(&mut dh1, &dact, &a.h1)?;
    let mut dh0 = vec![0.0; tokens * dv];
    let g1 = g.as_mut().map(|g| &mut *g.linear_1);
    linear_back(Some(&mut dh0), g1, &dh1, &a.h0, w.linear_1, dv, d)?;
    let gm = g.as_mut().map(|g| &mut *g.merge);
    let mut dmerged = vec![0.0; tokens * dv * mm];
    linear_back(
        Some(&mut dmerged),
        gm,
        &dh0,
        &a.merged,
        w.merge,
        dv * mm,
        dv,
    )?;
    let dxn = scatter_merged(&dmerged, &a.sources, dv, mm, x.len());
    // The norm's input gradient is only needed below the projector; its weight gradient
    // needs the same pass, so a frozen tower still gets a throwaway buffer.
    let mut sink = Vec::new();
    let dx = match dx {
        Some(dx) => dx,
        None => {
            sink.resize(x.len(), 0.0);
            &mut sink[..]
        }
    };
    let mut norm_sink = vec![0.0; dv];
    let gn = g.map_or(&mut norm_sink[..], |g| g.norm);
    rmsnorm::rmsnorm_backward(dx, gn, &dxn, x, w.norm, &a.rstd, dv)
}

/// The transpose of the merge gather: `[M, Dv*m*m]` back to `[P, Dv]` (dropped patches get 0).
fn scatter_merged(
    dmerged: &[f32],
    sources: &[usize],
    dv: usize,
    mm: usize,
    len: usize,
) -> Vec<f32> {
    let mut dxn = vec![0.0; len];
    for (row, src) in dmerged.chunks_exact(dv * mm).zip(sources.chunks_exact(mm)) {
        for (q, &s) in src.iter().enumerate() {
            for (c, o) in dxn[s * dv..][..dv].iter_mut().enumerate() {
                *o += row[c * mm + q];
            }
        }
    }
    dxn
}
