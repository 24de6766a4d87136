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
//!
//! The merge is two data-movement ops on the device: a row gather of the normed patches in
//! merge order (`[M*m*m, Dv]`, `sources` below, a host index list) and a batched transpose of
//! each token's `[m*m, Dv]` block to `[Dv, m*m]`; its backward is the transpose back and a
//! row scatter-add (dropped odd rows/cols get 0).

use super::config::Mistral3Config;
use super::params::Projector;
use super::pixtral::PatchGrid;
use super::precision::{linear, linear_back, store, ActElem};
use super::source::{group_grad, GradSink, ParamSource};
use super::ModelError;
use cannon_kernels::device_ctx::DeviceCtx;
use cannon_kernels::index::TransposeDims;
use cannon_kernels::{ops, KernelError, Tensor};
use cannon_runtime::trace::{self, Cat};
use cannon_runtime::{BufferView, BufferViewMut};

/// Everything the projector forward saves.
#[derive(Debug)]
pub struct ProjectorActs<A: cannon_runtime::Element> {
    /// `sources[t*m*m + di*m + dj]` = the patch merged into token t at block offset (di, dj).
    pub sources: Vec<usize>,
    pub rstd: Tensor<f32>, // [P]
    pub merged: Tensor<A>, // [M, Dv*m*m]  norm output, gathered
    pub h0: Tensor<A>,     // [M, Dv]
    pub h1: Tensor<f32>,   // [M, D]
    pub act: Tensor<A>,    // [M, D]  gelu(h1)
    pub out: Tensor<f32>,  // [M, D]
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

/// The merge's transpose of each token's `[m*m, Dv]` block of gathered rows to `[Dv, m*m]`.
fn merge_dims(tokens: usize, dv: usize, mm: usize) -> TransposeDims {
    TransposeDims {
        batch: tokens,
        rows: mm,
        cols: dv,
    }
}

/// Projector forward from the vision output `x [P, Dv]`.
pub fn forward<A: ActElem>(
    exec: &DeviceCtx,
    cfg: &Mistral3Config,
    params: &dyn ParamSource,
    grid: &PatchGrid,
    x: &BufferView<'_, f32>,
) -> Result<ProjectorActs<A>, ModelError> {
    let st = exec.stream();
    let _span = trace::span("projector forward", Cat::Layer);
    let dv = cfg.vision_config.hidden_size;
    let d = cfg.text_config.hidden_size;
    let m = cfg.spatial_merge_size;
    let mm = m * m;
    let pg = params.layout().projector();
    let fetched = params.fetch(pg)?;
    let w = Projector::split(fetched.view()?, &params.layout().groups[pg])?;
    let p = x.len() / dv.max(1);
    let eps = cfg.text_config.rms_norm_eps as f32;
    let sources = merge_sources(grid, m);
    let tokens = sources.len() / mm.max(1);
    let mut a = ProjectorActs {
        rstd: exec.empty(&[p])?,
        merged: exec.empty(&[tokens, dv * mm])?,
        h0: exec.empty(&[tokens, dv])?,
        h1: exec.empty(&[tokens, d])?,
        act: exec.empty(&[tokens, d])?,
        out: exec.empty(&[tokens, d])?,
        sources,
    };
    // f32 working tensors, freed on return.
    let mut xn = exec.empty::<f32>(&[p, dv])?;
    let mut gathered = exec.empty::<f32>(&[tokens * mm, dv])?;
    let mut merged32 = exec.empty::<f32>(&[tokens, dv * mm])?;
    let mut h = exec.empty::<f32>(&[tokens, dv])?;
    let mut g = exec.empty::<f32>(&[tokens, d])?;

    ops::rmsnorm_forward(
        st,
        &mut xn.view_mut(),
        &mut a.rstd.view_mut(),
        x,
        &w.norm,
        dv,
        eps,
    )?;
    ops::gather_rows(st, &mut gathered.view_mut(), &xn.view(), &a.sources, dv)?;
    let md = merge_dims(tokens, dv, mm);
    ops::transpose(st, &mut merged32.view_mut(), &gathered.view(), md)?;
    store(st, &merged32.view(), &mut a.merged.view_mut())?;
    linear(
        st,
        &mut h.view_mut(),
        &a.merged.view(),
        &w.merge,
        dv * mm,
        dv,
    )?;
    store(st, &h.view(), &mut a.h0.view_mut())?;
    linear(st, &mut a.h1.view_mut(), &a.h0.view(), &w.linear_1, dv, d)?;
    ops::gelu_forward(st, &mut g.view_mut(), &a.h1.view())?;
    store(st, &g.view(), &mut a.act.view_mut())?;
    linear(st, &mut a.out.view_mut(), &a.act.view(), &w.linear_2, d, d)?;
    drop(fetched);
    Ok(a)
}

/// Projector backward from `dout [M, D]`: accumulates the projector's weight gradients if its
/// group trains, and when `dx` is given accumulates the gradient of the vision output
/// `x [P, Dv]` into it.
#[allow(clippy::too_many_arguments)]
pub fn backward<A: ActElem>(
    exec: &DeviceCtx,
    cfg: &Mistral3Config,
    params: &dyn ParamSource,
    a: &ProjectorActs<A>,
    x: &BufferView<'_, f32>,
    dout: &BufferView<'_, f32>,
    grads: &mut dyn GradSink,
    dx: Option<BufferViewMut<'_, f32>>,
) -> Result<(), ModelError> {
    let st = exec.stream();
    let _span = trace::span("projector backward", Cat::Layer);
    let dv = cfg.vision_config.hidden_size;
    let d = cfg.text_config.hidden_size;
    let mm = cfg.spatial_merge_size * cfg.spatial_merge_size;
    let tokens = a.sources.len() / mm.max(1);
    let p = x.len() / dv.max(1);
    let layout = params.layout();
    let gi = layout.projector();
    let fetched = params.fetch(gi)?;
    let w = Projector::split(fetched.view()?, &layout.groups[gi])?;
    let mut g = group_grad(grads, gi, Projector::ranges(&layout.groups[gi]))?;
    // Working tensors, freed on return: the gradients of every saved activation, back to
    // the norm's input (a throwaway one when nothing below the projector needs it: the norm
    // weight's gradient needs the same pass).
    let mut dact = exec.zeros::<f32>(&[tokens, d])?;
    let mut dh1 = exec.zeros::<f32>(&[tokens, d])?;
    let mut dh0 = exec.zeros::<f32>(&[tokens, dv])?;
    let mut dmerged = exec.zeros::<f32>(&[tokens, dv * mm])?;
    let mut dgathered = exec.empty::<f32>(&[tokens * mm, dv])?;
    let mut dxn = exec.zeros::<f32>(&[p, dv])?;
    let mut norm_sink = exec.empty::<f32>(&[dv])?;
    let mut x_sink = match dx {
        Some(_) => None,
        None => Some(exec.zeros::<f32>(&[p, dv])?),
    };

    let g2 = g.as_mut().map(|g| g.win(|r| &r.linear_2)).transpose()?;
    linear_back(
        st,
        Some(dact.view_mut()),
        g2,
        dout,
        &a.act.view(),
        &w.linear_2,
        d,
        d,
    )?;
    ops::gelu_backward(st, &mut dh1.view_mut(), &dact.view(), &a.h1.view())?;
    let g1 = g.as_mut().map(|g| g.win(|r| &r.linear_1)).transpose()?;
    linear_back(
        st,
        Some(dh0.view_mut()),
        g1,
        &dh1.view(),
        &a.h0.view(),
        &w.linear_1,
        dv,
        d,
    )?;
    let gm = g.as_mut().map(|g| g.win(|r| &r.merge)).transpose()?;
    let merged = a.merged.view();
    linear_back(
        st,
        Some(dmerged.view_mut()),
        gm,
        &dh0.view(),
        &merged,
        &w.merge,
        dv * mm,
        dv,
    )?;
    // The transpose of the merge gather: [M, Dv, m*m] -> [M, m*m, Dv] -> rows of [P, Dv].
    let back = TransposeDims {
        batch: tokens,
        rows: dv,
        cols: mm,
    };
    ops::transpose(st, &mut dgathered.view_mut(), &dmerged.view(), back)?;
    ops::scatter_add_rows(st, &mut dxn.view_mut(), &dgathered.view(), &a.sources, dv)?;
    let mut dx = match (dx, x_sink.as_mut()) {
        (Some(dx), _) => dx,
        (None, Some(sink)) => sink.view_mut(),
        (None, None) => return Err(missing("projector x gradient").into()),
    };
    let mut gn = match g.as_mut() {
        Some(g) => g.win(|r| &r.norm)?,
        None => norm_sink.view_mut(),
    };
    let (dxn, rstd) = (dxn.view(), a.rstd.view());
    ops::rmsnorm_backward(st, &mut dx, &mut gn, &dxn, x, &w.norm, &rstd, dv)?;
    drop(fetched);
    grads.release(gi)
}

fn missing(what: &str) -> KernelError {
    KernelError::InvalidArgument {
        op: "projector",
        detail: format!("{what} missing"),
    }
}
