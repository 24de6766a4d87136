//! The precision policy of a run, and the few kernel calls whose flavour depends on it.
//!
//! Every op of the model is a `cannon_kernels` device-level op (`cannon_kernels::ops::*` on a
//! [`Stream`], over runtime buffers); this module only decides, per precision, which kernel
//! entry point a GEMM calls and in which type the activations that feed GEMMs and the
//! attention are stored, and names the few elementwise calls the layers share.
//!
//! Mixed precision follows `torch.autocast(dtype=bfloat16)` over f32 master weights:
//!
//! | what                                                        | f32 run | bf16 run      |
//! |-------------------------------------------------------------|---------|---------------|
//! | master weights, optimizer state, weight gradients           | f32     | f32           |
//! | GEMM (linear, patch conv) operands: weights, activations    | f32     | bf16          |
//! | attention q, k, v, out and their gradients                  | f32     | bf16          |
//! | activations saved for backward that feed a GEMM/attention   | f32     | bf16 storage  |
//! | GEMM accumulation and outputs                               | f32     | f32           |
//! | residual stream and its gradient, RMSNorm (+ its weight),   | f32     | f32           |
//! | embedding table, GELU/SiLU, softmax + LSE, loss             |         |               |
//!
//! The weight operands are the f32 master weights rounded to bf16 (nearest even) as the GEMM
//! packs them, so no bf16 copy of the model exists; norm weights and the embedding table are
//! not GEMM operands and stay f32, as autocast leaves them. In the backward the bf16 GEMMs read
//! the incoming f32 activation gradient rounded to bf16 (autocast's bf16 matmul backward does
//! the same), accumulate in f32 and add into f32 gradients.
//!
//! Why this split (worst gradient rel. L2 vs the float64 fixtures, shared tiny / gqa1; the
//! bar is 0.04, `cannon verify --dtype bf16`): rounding EVERY parameter to bf16 (FSDP2's
//! `param_dtype`) gave 0.041 / 0.055, about half from the weights (0.032 / 0.038 alone) and
//! half from the activations (0.021 / 0.034 alone), spread over every rounding site with no
//! single dominant one. Most of the weight part is the RMSNorm weights (values 1 +- 0.2 whose
//! rounding rescales whole activations): rounding only the GEMM weights gives 0.034 / 0.032.
//! Rounding the f32 gradient fed to the backward GEMMs adds ~0.003 (0.037 / 0.034). Storing
//! the gate/up GEMM outputs in bf16 and rounding silu before the product (transformers' bf16
//! order) adds ~0.007 (0.045 / 0.039), so they stay f32 like every GEMM output and `h` is
//! rounded once; the bf16 attention backward (vs f32 on the same bf16 inputs) changes
//! nothing measurable. Result: 0.038 / 0.034 (tiny-seed7 0.033, wide 0.019).

use cannon_kernels::linear::{LinearDims, LinearGradBufs};
use cannon_kernels::patch_embed::{PatchEmbedGradBufs, PatchGeom};
use cannon_kernels::{ops, KernelError};
use cannon_runtime::{BufferView, BufferViewMut, Float, Stream};
use half::bf16;

type Result<T> = std::result::Result<T, KernelError>;

/// Numeric precision of a run (see the module docs for what each one rounds): the kernels'
/// one [`Precision`], which names the precision of the GEMM products.
pub use cannon_kernels::Precision;

/// The storage type of the activations that feed GEMMs and the attention: `f32` for an f32
/// run, `bf16` for mixed precision. GEMMs always read f32 master weights and write f32; their
/// products are taken in [`ActElem::PRECISION`].
pub trait ActElem: Float {
    const PRECISION: Precision;
}

impl ActElem for f32 {
    const PRECISION: Precision = Precision::F32;
}

impl ActElem for bf16 {
    const PRECISION: Precision = Precision::Bf16;
}

/// The dims of a linear layer `[din] -> [dout]` applied to the rows of `x` (`len / din`).
pub fn dims(x_len: usize, din: usize, dout: usize) -> LinearDims {
    LinearDims {
        t: x_len / din.max(1),
        d_in: din,
        d_out: dout,
    }
}

/// `y[T,dout] = x[T,din] w^T` in the run's precision (overwrites y).
pub fn linear<A: ActElem>(
    s: &Stream,
    y: &mut BufferViewMut<'_, f32>,
    x: &BufferView<'_, A>,
    w: &BufferView<'_, f32>,
    din: usize,
    dout: usize,
) -> Result<()> {
    ops::linear_forward(s, A::PRECISION, y, x, w, None, dims(x.len(), din, dout))
}

/// `dx += dy w`, `dw += dy^T x` (each if given) in the run's precision; `dy` is f32, or the
/// activation storage type (the attention's q/k/v gradients).
#[allow(clippy::too_many_arguments)]
pub fn linear_back<A: ActElem, G: Float>(
    s: &Stream,
    dx: Option<BufferViewMut<'_, f32>>,
    dw: Option<BufferViewMut<'_, f32>>,
    dy: &BufferView<'_, G>,
    x: &BufferView<'_, A>,
    w: &BufferView<'_, f32>,
    din: usize,
    dout: usize,
) -> Result<()> {
    let g = LinearGradBufs { dx, dw, db: None };
    ops::linear_backward(s, A::PRECISION, g, dy, x, w, dims(x.len(), din, dout))
}

/// Pixtral's patch conv on one image in the run's precision: `out[Np,D] = im2col(pixels) w^T`.
pub fn patch_embed<A: ActElem>(
    s: &Stream,
    out: &mut BufferViewMut<'_, f32>,
    pixels: &BufferView<'_, f32>,
    w: &BufferView<'_, f32>,
    g: PatchGeom,
    d: usize,
) -> Result<()> {
    ops::patch_embed_forward(s, A::PRECISION, out, pixels, w, g, d)
}

/// Its backward: `dw += dout^T im2col(pixels)`, `dpixels += col2im(dout w)`.
#[allow(clippy::too_many_arguments)]
pub fn patch_embed_back<A: ActElem>(
    s: &Stream,
    grads: PatchEmbedGradBufs<'_>,
    dout: &BufferView<'_, f32>,
    pixels: &BufferView<'_, f32>,
    w: &BufferView<'_, f32>,
    g: PatchGeom,
    d: usize,
) -> Result<()> {
    ops::patch_embed_backward(s, A::PRECISION, grads, dout, pixels, w, g, d)
}

/// Stores f32 values as activations (rounding to bf16 in a bf16 run; a copy in f32).
pub fn store<A: ActElem>(
    s: &Stream,
    src: &BufferView<'_, f32>,
    dst: &mut BufferViewMut<'_, A>,
) -> Result<()> {
    ops::cast(s, src, dst)
}

/// `y += x`, elementwise (residual adds).
pub fn add_into(s: &Stream, y: &mut BufferViewMut<'_, f32>, x: &BufferView<'_, f32>) -> Result<()> {
    ops::add_into(s, y, x)
}

/// Copies `src` into `dst` on the device (same length).
pub fn copy(s: &Stream, dst: &mut BufferViewMut<'_, f32>, src: &BufferView<'_, f32>) -> Result<()> {
    Ok(dst.memcpy_dtod(s, src)?)
}
