//! The slice-level API of [`super`] on host memory: the CPU kernels themselves, each
//! checking the op's rules and running the code of `cpu.rs`. [`crate::ops`] runs these on
//! the buffers' host slices when the stream is on the CPU.

use super::*;

/// `Y[T,O] = X[T,I] W[O,I]^T (+ b[O])` in precision `p`.
///
/// `F32`: X, W, b and Y must be f32. `Bf16`: X, W, b are bf16 or f32 (rounded to bf16 in the
/// product), products accumulate in f32, the bias is added in f32, and Y is written as f32
/// or rounded once to bf16 (nearest even), by Y's type.
pub fn linear_forward<Y: Float, X: Float, W: Float>(
    p: Precision,
    y: &mut [Y],
    x: &[X],
    w: &[W],
    b: Option<&[W]>,
    d: LinearDims,
) -> Result<()> {
    let op = "linear_forward";
    check_forward::<Y, X, W>(p, d, y.len(), x.len(), w.len(), b.map(|b| b.len()))?;
    match p {
        Precision::F32 => {
            let y = cast::as_f32_mut(y).ok_or_else(|| not_f32(op, "y"))?;
            let x = cast::as_f32(x).ok_or_else(|| not_f32(op, "x"))?;
            let w = cast::as_f32(w).ok_or_else(|| not_f32(op, "w"))?;
            let b = b.map(|b| cast::as_f32(b).ok_or_else(|| not_f32(op, "b")));
            cpu::forward::<F32, _, _>(y, x, w, b.transpose()?, d)
        }
        Precision::Bf16 => match cast::as_bf16_mut(y) {
            Some(y) => cpu::forward_bf16_to_bf16(y, x, w, b, d),
            None => {
                let y = cast::as_f32_mut(y).ok_or_else(|| not_f32(op, "y"))?;
                cpu::forward::<Bf16, _, _>(y, x, w, b, d)
            }
        },
    }
}

/// Accumulates `dX += dY W`, `dW += dY^T X`, `db += sum_t dY` (each if present) in precision
/// `p`; `x` and `w` are the forward's inputs: `[T, I]` and `[O, I]`; `dy` is `[T, O]`.
/// Gradients are f32 in both precisions; under `Bf16` dY, X, W may be bf16 or f32 (rounded
/// to bf16 in the products) and db sums dY's own values in f32.
pub fn linear_backward<G: Float, X: Float, W: Float>(
    p: Precision,
    g: LinearGrads,
    dy: &[G],
    x: &[X],
    w: &[W],
    d: LinearDims,
) -> Result<()> {
    let op = "linear_backward";
    check_backward::<G, X, W>(p, d, g.lens(), dy.len(), x.len(), w.len())?;
    match p {
        Precision::F32 => {
            let dy = cast::as_f32(dy).ok_or_else(|| not_f32(op, "dy"))?;
            let x = cast::as_f32(x).ok_or_else(|| not_f32(op, "x"))?;
            let w = cast::as_f32(w).ok_or_else(|| not_f32(op, "w"))?;
            cpu::backward::<F32, _, _, _>(g, dy, x, w, d)
        }
        Precision::Bf16 => cpu::backward::<Bf16, _, _, _>(g, dy, x, w, d),
    }
}
