//! CPU linear: the products run on `gemm` (threaded there); the bias and its gradient are
//! row broadcasts / column sums done here. Lengths were checked by mod.rs.

use super::{LinearDims, LinearGrads};
use crate::error::Result;
use crate::gemm::{host::gemm_bf16, Dims, Products, Trans};
use cannon_runtime::Float;
use rayon::prelude::*;

/// Columns of db per rayon task: wide enough that a task is worth scheduling.
const DB_CHUNK: usize = 1024;
/// Tile of Y computed in f32 before rounding to bf16 (bounds the scratch to 8 MiB; a column
/// tile as wide as the GEMM's B panel adds no packing work).
const Y_TILE_ROWS: usize = 1024;
const Y_TILE_COLS: usize = 2048;

/// Fills every row of `y[T,O]` with the bias (so the product can accumulate onto it).
fn broadcast_bias(y: &mut [f32], b: impl Fn(usize) -> f32 + Sync, d_out: usize) {
    if d_out == 0 {
        return;
    }
    let row: Vec<f32> = (0..d_out).map(b).collect();
    y.par_chunks_mut(d_out)
        .for_each(|yr| yr.copy_from_slice(&row));
}

/// `db[O] += sum_t dy[t, O]`, summed in f32 per column in token order.
fn bias_grad(db: &mut [f32], dy: impl Fn(usize) -> f32 + Sync, d: LinearDims) {
    db.par_chunks_mut(DB_CHUNK)
        .enumerate()
        .for_each(|(ci, dbc)| {
            let c0 = ci * DB_CHUNK;
            let mut acc = vec![0.0f32; dbc.len()];
            for t in 0..d.t {
                let base = t * d.d_out + c0;
                for (j, a) in acc.iter_mut().enumerate() {
                    *a += dy(base + j);
                }
            }
            for (o, a) in dbc.iter_mut().zip(acc) {
                *o += a;
            }
        });
}

fn gemm_dims(m: usize, n: usize, k: usize) -> Dims {
    Dims { m, n, k }
}

/// `Y[T,O] = X W^T (+ b)` in precision `P`.
pub(super) fn forward<P: Products<X, W>, X, W: Float>(
    y: &mut [f32],
    x: &[X],
    w: &[W],
    b: Option<&[W]>,
    d: LinearDims,
) -> Result<()> {
    let beta = match b {
        Some(b) => {
            broadcast_bias(y, |j| b[j].to_f32(), d.d_out);
            1.0
        }
        None => 0.0,
    };
    let gd = gemm_dims(d.t, d.d_out, d.d_in);
    P::gemm(
        Trans::N,
        Trans::T,
        gd,
        1.0,
        x,
        d.d_in,
        w,
        d.d_in,
        beta,
        y,
        d.d_out,
    )
}

/// The requested gradients of a linear layer, accumulated, in precision `P`.
pub(super) fn backward<P, G: Float, X, W>(
    g: LinearGrads,
    dy: &[G],
    x: &[X],
    w: &[W],
    d: LinearDims,
) -> Result<()>
where
    P: Products<G, W> + Products<G, X>,
{
    if let Some(dx) = g.dx {
        // dX[T,I] += dY[T,O] W[O,I]
        let gd = gemm_dims(d.t, d.d_in, d.d_out);
        <P as Products<G, W>>::gemm(
            Trans::N,
            Trans::N,
            gd,
            1.0,
            dy,
            d.d_out,
            w,
            d.d_in,
            1.0,
            dx,
            d.d_in,
        )?;
    }
    if let Some(dw) = g.dw {
        // dW[O,I] += dY[T,O]^T X[T,I]
        let gd = gemm_dims(d.d_out, d.d_in, d.t);
        <P as Products<G, X>>::gemm(
            Trans::T,
            Trans::N,
            gd,
            1.0,
            dy,
            d.d_out,
            x,
            d.d_in,
            1.0,
            dw,
            d.d_in,
        )?;
    }
    if let Some(db) = g.db {
        bias_grad(db, |i| dy[i].to_f32(), d);
    }
    Ok(())
}

/// `Y` stored as bf16: tiles of Y are computed in f32 (bias included) and rounded once.
pub(super) fn forward_bf16_to_bf16<X: Float, W: Float>(
    y: &mut [half::bf16],
    x: &[X],
    w: &[W],
    b: Option<&[W]>,
    d: LinearDims,
) -> Result<()> {
    let cols = Y_TILE_COLS.min(d.d_out);
    let mut tile = vec![0.0f32; Y_TILE_ROWS.min(d.t) * cols];
    for t0 in (0..d.t).step_by(Y_TILE_ROWS) {
        let rows = Y_TILE_ROWS.min(d.t - t0);
        let xs = &x[t0 * d.d_in..(t0 + rows) * d.d_in];
        for o0 in (0..d.d_out).step_by(Y_TILE_COLS) {
            let nc = Y_TILE_COLS.min(d.d_out - o0);
            let tile = &mut tile[..rows * nc];
            let beta = match b {
                Some(b) => {
                    broadcast_bias(tile, |j| b[o0 + j].to_f32(), nc);
                    1.0
                }
                None => 0.0,
            };
            // tile[rows, nc] = X[t0.., :] W[o0..o0+nc, :]^T
            let gd = gemm_dims(rows, nc, d.d_in);
            let ws = &w[o0 * d.d_in..(o0 + nc) * d.d_in];
            gemm_bf16(
                Trans::N,
                Trans::T,
                gd,
                1.0,
                xs,
                d.d_in,
                ws,
                d.d_in,
                beta,
                tile,
                nc,
            )?;
            y[t0 * d.d_out..(t0 + rows) * d.d_out]
                .par_chunks_mut(d.d_out)
                .zip(tile.par_chunks(nc))
                .for_each(|(yr, tr)| {
                    for (o, &v) in yr[o0..o0 + nc].iter_mut().zip(tr) {
                        *o = half::bf16::from_f32(v);
                    }
                });
        }
    }
    Ok(())
}
