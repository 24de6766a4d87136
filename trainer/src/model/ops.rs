//! The precision policy of a run, and the few kernel calls whose flavour depends on it.
//!
//! Every op of the model is a `cannon_kernels` op; this module only decides, per precision,
//! which kernel entry point a GEMM calls and in which type the activations that feed GEMMs and
//! the attention are stored.
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

use cannon_kernels::cast::{self};
use cannon_kernels::linear::{self, LinearDims, LinearGrads};
use cannon_kernels::patch_embed::{self, PatchEmbedGrads, PatchGeom};
use cannon_kernels::KernelError;
use cannon_runtime::Float;
use half::bf16;

/// Numeric precision of a run (see the module docs for what each one rounds): the kernels'
/// one [`Precision`], which names the precision of the GEMM products.
pub use cannon_kernels::Precision;

/// The storage type of the activations that feed GEMMs and the attention: `f32` for an f32
/// run, `bf16` for mixed precision. GEMMs always read f32 master weights and write f32.
pub trait Act: Float {
    const PRECISION: Precision;

    /// `y[T,O] = x[T,I] w[O,I]^T` (overwrites y).
    fn linear(y: &mut [f32], x: &[Self], w: &[f32], d: LinearDims) -> Result<(), KernelError>;

    /// `dx[T,I] += dy w`, `dw[O,I] += dy^T x` (either optional), from an f32 `dy[T,O]`.
    fn linear_back(
        g: LinearGrads,
        dy: &[f32],
        x: &[Self],
        w: &[f32],
        d: LinearDims,
    ) -> Result<(), KernelError>;

    /// As [`Act::linear_back`] with `dy` in activation storage (the attention's q/k/v grads).
    fn linear_back_act(
        g: LinearGrads,
        dy: &[Self],
        x: &[Self],
        w: &[f32],
        d: LinearDims,
    ) -> Result<(), KernelError>;

    /// Pixtral's patch conv on one image: `out[Np,D] = im2col(pixels) w^T`.
    fn patch_embed(
        out: &mut [f32],
        pixels: &[f32],
        w: &[f32],
        g: PatchGeom,
        d: usize,
    ) -> Result<(), KernelError>;

    /// Its backward: `dw += dout^T im2col(pixels)`, `dpixels += col2im(dout w)`.
    fn patch_embed_back(
        grads: PatchEmbedGrads,
        dout: &[f32],
        pixels: &[f32],
        w: &[f32],
        g: PatchGeom,
        d: usize,
    ) -> Result<(), KernelError>;
}

impl Act for f32 {
    const PRECISION: Precision = Precision::F32;

    fn linear(y: &mut [f32], x: &[f32], w: &[f32], d: LinearDims) -> Result<(), KernelError> {
        linear::linear_forward(Precision::F32, y, x, w, None, d)
    }

    fn linear_back(
        g: LinearGrads,
        dy: &[f32],
        x: &[f32],
        w: &[f32],
        d: LinearDims,
    ) -> Result<(), KernelError> {
        linear::linear_backward(Precision::F32, g, dy, x, w, d)
    }

    fn linear_back_act(
        g: LinearGrads,
        dy: &[f32],
        x: &[f32],
        w: &[f32],
        d: LinearDims,
    ) -> Result<(), KernelError> {
        linear::linear_backward(Precision::F32, g, dy, x, w, d)
    }

    fn patch_embed(
        out: &mut [f32],
        pixels: &[f32],
        w: &[f32],
        g: PatchGeom,
        d: usize,
    ) -> Result<(), KernelError> {
        patch_embed::patch_embed_forward(Precision::F32, out, pixels, w, g, d)
    }

    fn patch_embed_back(
        grads: PatchEmbedGrads,
        dout: &[f32],
        pixels: &[f32],
        w: &[f32],
        g: PatchGeom,
        d: usize,
    ) -> Result<(), KernelError> {
        patch_embed::patch_embed_backward(Precision::F32, grads, dout, pixels, w, g, d)
    }
}

impl Act for bf16 {
    const PRECISION: Precision = Precision::Bf16;

    fn linear(y: &mut [f32], x: &[bf16], w: &[f32], d: LinearDims) -> Result<(), KernelError> {
        linear::linear_forward(Precision::Bf16, y, x, w, None, d)
    }

    fn linear_back(
        g: LinearGrads,
        dy: &[f32],
        x: &[bf16],
        w: &[f32],
        d: LinearDims,
    ) -> Result<(), KernelError> {
        linear::linear_backward(Precision::Bf16, g, dy, x, w, d)
    }

    fn linear_back_act(
        g: LinearGrads,
        dy: &[bf16],
        x: &[bf16],
        w: &[f32],
        d: LinearDims,
    ) -> Result<(), KernelError> {
        linear::linear_backward(Precision::Bf16, g, dy, x, w, d)
    }

    fn patch_embed(
        out: &mut [f32],
        pixels: &[f32],
        w: &[f32],
        g: PatchGeom,
        d: usize,
    ) -> Result<(), KernelError> {
        patch_embed::patch_embed_forward(Precision::Bf16, out, pixels, w, g, d)
    }

    fn patch_embed_back(
        grads: PatchEmbedGrads,
        dout: &[f32],
        pixels: &[f32],
        w: &[f32],
        g: PatchGeom,
        d: usize,
    ) -> Result<(), KernelError> {
        patch_embed::patch_embed_backward(Precision::Bf16, grads, dout, pixels, w, g, d)
    }
}

/// The dims of a linear layer `[din] -> [dout]` applied to the rows of `x` (`len / din`).
pub fn dims(x_len: usize, din: usize, dout: usize) -> LinearDims {
    LinearDims {
        t: x_len / din.max(1),
        d_in: din,
        d_out: dout,
    }
}

/// `y[T,dout] = x[T,din] w^T` in the run's precision.
pub fn linear<A: Act>(
    y: &mut [f32],
    x: &[A],
    w: &[f32],
    din: usize,
    dout: usize,
) -> Result<(), KernelError> {
    A::linear(y, x, w, dims(x.len(), din, dout))
}

/// `dx += dy w`, `dw += dy^T x` (each if given) in the run's precision, `dy` f32.
pub fn linear_back<A: Act>(
    dx: Option<&mut [f32]>,
    dw: Option<&mut [f32]>,
    dy: &[f32],
    x: &[A],
    w: &[f32],
    din: usize,
    dout: usize,
) -> Result<(), KernelError> {
    let g = LinearGrads { dx, dw, db: None };
    A::linear_back(g, dy, x, w, dims(x.len(), din, dout))
}

/// As [`linear_back`] with `dy` in activation storage.
pub fn linear_back_act<A: Act>(
    dx: Option<&mut [f32]>,
    dw: Option<&mut [f32]>,
    dy: &[A],
    x: &[A],
    w: &[f32],
    din: usize,
    dout: usize,
) -> Result<(), KernelError> {
    let g = LinearGrads { dx, dw, db: None };
    A::linear_back_act(g, dy, x, w, dims(x.len(), din, dout))
}

/// Stores f32 values as activations (rounding to bf16 in a bf16 run; a copy in f32).
pub fn store<A: Act>(src: &[f32], dst: &mut [A]) -> Result<(), KernelError> {
    cast::cast(src, dst)
}

/// Widens stored activations back to f32 (exact).
pub fn widen<A: Act>(src: &[A], dst: &mut [f32]) -> Result<(), KernelError> {
    cast::cast(src, dst)
}

/// `len` zeroed activations.
pub fn zeros<A: Act>(len: usize) -> Vec<A> {
    vec![A::default(); len]
}

/// `y += x`, elementwise (residual adds).
pub fn add_into(y: &mut [f32], x: &[f32]) {
    for (a, &b) in y.iter_mut().zip(x) {
        *a += b;
    }
}
