//! The precision policy of a run, and the few kernel calls whose flavour depends on it.
//!
//! Every op of the model is a `cannon_kernels` device-level op (`op::device::*` on a
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

use cannon_kernels::attention::Element;
use cannon_kernels::cast::{self, Elem};
use cannon_kernels::gemm::Bf16Elem;
use cannon_kernels::linear::{self, device::Grads as LinearGrads, LinearDims};
use cannon_kernels::patch_embed::{self, device::Grads as PatchEmbedGrads, PatchGeom};
use cannon_kernels::{elementwise, KernelError};
use cannon_runtime::{BufferView, BufferViewMut, Stream};
use half::bf16;

type Result<T> = std::result::Result<T, KernelError>;

/// Numeric precision of a run (see the module docs for what each one rounds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    F32,
    Bf16,
}

impl Precision {
    /// Bytes of one stored activation.
    pub fn act_bytes(self) -> usize {
        match self {
            Precision::F32 => 4,
            Precision::Bf16 => 2,
        }
    }
}

/// The storage type of the activations that feed GEMMs and the attention: `f32` for an f32
/// run, `bf16` for mixed precision. GEMMs always read f32 master weights and write f32.
pub trait Act: Elem + Element + Bf16Elem + bytemuck::Pod {
    const PRECISION: Precision;

    /// `y[T,O] = x[T,I] w[O,I]^T` (overwrites y).
    fn linear(
        s: &Stream,
        y: &mut BufferViewMut<'_, f32>,
        x: &BufferView<'_, Self>,
        w: &BufferView<'_, f32>,
        d: LinearDims,
    ) -> Result<()>;

    /// `dx[T,I] += dy w`, `dw[O,I] += dy^T x` (either optional), from an f32 `dy[T,O]`.
    fn linear_back(
        s: &Stream,
        g: LinearGrads<'_>,
        dy: &BufferView<'_, f32>,
        x: &BufferView<'_, Self>,
        w: &BufferView<'_, f32>,
        d: LinearDims,
    ) -> Result<()>;

    /// As [`Act::linear_back`] with `dy` in activation storage (the attention's q/k/v grads).
    fn linear_back_act(
        s: &Stream,
        g: LinearGrads<'_>,
        dy: &BufferView<'_, Self>,
        x: &BufferView<'_, Self>,
        w: &BufferView<'_, f32>,
        d: LinearDims,
    ) -> Result<()>;

    /// Pixtral's patch conv on one image: `out[Np,D] = im2col(pixels) w^T`.
    fn patch_embed(
        s: &Stream,
        out: &mut BufferViewMut<'_, f32>,
        pixels: &BufferView<'_, f32>,
        w: &BufferView<'_, f32>,
        g: PatchGeom,
        d: usize,
    ) -> Result<()>;

    /// Its backward: `dw += dout^T im2col(pixels)`, `dpixels += col2im(dout w)`.
    fn patch_embed_back(
        s: &Stream,
        grads: PatchEmbedGrads<'_>,
        dout: &BufferView<'_, f32>,
        pixels: &BufferView<'_, f32>,
        w: &BufferView<'_, f32>,
        g: PatchGeom,
        d: usize,
    ) -> Result<()>;
}

impl Act for f32 {
    const PRECISION: Precision = Precision::F32;

    fn linear(
        s: &Stream,
        y: &mut BufferViewMut<'_, f32>,
        x: &BufferView<'_, f32>,
        w: &BufferView<'_, f32>,
        d: LinearDims,
    ) -> Result<()> {
        linear::device::forward(s, y, x, w, None, d)
    }

    fn linear_back(
        s: &Stream,
        g: LinearGrads<'_>,
        dy: &BufferView<'_, f32>,
        x: &BufferView<'_, f32>,
        w: &BufferView<'_, f32>,
        d: LinearDims,
    ) -> Result<()> {
        linear::device::backward(s, g, dy, x, w, d)
    }

    fn linear_back_act(
        s: &Stream,
        g: LinearGrads<'_>,
        dy: &BufferView<'_, f32>,
        x: &BufferView<'_, f32>,
        w: &BufferView<'_, f32>,
        d: LinearDims,
    ) -> Result<()> {
        linear::device::backward(s, g, dy, x, w, d)
    }

    fn patch_embed(
        s: &Stream,
        out: &mut BufferViewMut<'_, f32>,
        pixels: &BufferView<'_, f32>,
        w: &BufferView<'_, f32>,
        g: PatchGeom,
        d: usize,
    ) -> Result<()> {
        patch_embed::device::forward(s, out, pixels, w, g, d)
    }

    fn patch_embed_back(
        s: &Stream,
        grads: PatchEmbedGrads<'_>,
        dout: &BufferView<'_, f32>,
        pixels: &BufferView<'_, f32>,
        w: &BufferView<'_, f32>,
        g: PatchGeom,
        d: usize,
    ) -> Result<()> {
        patch_embed::device::backward(s, grads, dout, pixels, w, g, d)
    }
}

impl Act for bf16 {
    const PRECISION: Precision = Precision::Bf16;

    fn linear(
        s: &Stream,
        y: &mut BufferViewMut<'_, f32>,
        x: &BufferView<'_, bf16>,
        w: &BufferView<'_, f32>,
        d: LinearDims,
    ) -> Result<()> {
        linear::device::forward_bf16(s, y, x, w, None, d)
    }

    fn linear_back(
        s: &Stream,
        g: LinearGrads<'_>,
        dy: &BufferView<'_, f32>,
        x: &BufferView<'_, bf16>,
        w: &BufferView<'_, f32>,
        d: LinearDims,
    ) -> Result<()> {
        linear::device::backward_bf16(s, g, dy, x, w, d)
    }

    fn linear_back_act(
        s: &Stream,
        g: LinearGrads<'_>,
        dy: &BufferView<'_, bf16>,
        x: &BufferView<'_, bf16>,
        w: &BufferView<'_, f32>,
        d: LinearDims,
    ) -> Result<()> {
        linear::device::backward_bf16(s, g, dy, x, w, d)
    }

    fn patch_embed(
        s: &Stream,
        out: &mut BufferViewMut<'_, f32>,
        pixels: &BufferView<'_, f32>,
        w: &BufferView<'_, f32>,
        g: PatchGeom,
        d: usize,
    ) -> Result<()> {
        patch_embed::device::forward_bf16(s, out, pixels, w, g, d)
    }

    fn patch_embed_back(
        s: &Stream,
        grads: PatchEmbedGrads<'_>,
        dout: &BufferView<'_, f32>,
        pixels: &BufferView<'_, f32>,
        w: &BufferView<'_, f32>,
        g: PatchGeom,
        d: usize,
    ) -> Result<()> {
        patch_embed::device::backward_bf16(s, grads, dout, pixels, w, g, d)
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
    s: &Stream,
    y: &mut BufferViewMut<'_, f32>,
    x: &BufferView<'_, A>,
    w: &BufferView<'_, f32>,
    din: usize,
    dout: usize,
) -> Result<()> {
    A::linear(s, y, x, w, dims(x.len(), din, dout))
}

/// `dx += dy w`, `dw += dy^T x` (each if given) in the run's precision, `dy` f32.
#[allow(clippy::too_many_arguments)]
pub fn linear_back<A: Act>(
    s: &Stream,
    dx: Option<BufferViewMut<'_, f32>>,
    dw: Option<BufferViewMut<'_, f32>>,
    dy: &BufferView<'_, f32>,
    x: &BufferView<'_, A>,
    w: &BufferView<'_, f32>,
    din: usize,
    dout: usize,
) -> Result<()> {
    let g = LinearGrads { dx, dw, db: None };
    A::linear_back(s, g, dy, x, w, dims(x.len(), din, dout))
}

/// As [`linear_back`] with `dy` in activation storage.
#[allow(clippy::too_many_arguments)]
pub fn linear_back_act<A: Act>(
    s: &Stream,
    dx: Option<BufferViewMut<'_, f32>>,
    dw: Option<BufferViewMut<'_, f32>>,
    dy: &BufferView<'_, A>,
    x: &BufferView<'_, A>,
    w: &BufferView<'_, f32>,
    din: usize,
    dout: usize,
) -> Result<()> {
    let g = LinearGrads { dx, dw, db: None };
    A::linear_back_act(s, g, dy, x, w, dims(x.len(), din, dout))
}

/// Stores f32 values as activations (rounding to bf16 in a bf16 run; a copy in f32).
pub fn store<A: Act>(
    s: &Stream,
    src: &BufferView<'_, f32>,
    dst: &mut BufferViewMut<'_, A>,
) -> Result<()> {
    cast::device::convert(s, src, dst)
}

/// `y += x`, elementwise (residual adds).
pub fn add_into(s: &Stream, y: &mut BufferViewMut<'_, f32>, x: &BufferView<'_, f32>) -> Result<()> {
    elementwise::device::add(s, y, x)
}

/// Copies `src` into `dst` on the device (same length).
pub fn copy(s: &Stream, dst: &mut BufferViewMut<'_, f32>, src: &BufferView<'_, f32>) -> Result<()> {
    Ok(dst.memcpy_dtod(s, src)?)
}
