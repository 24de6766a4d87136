//! Model FLOPs of a training step and the machine's GEMM peak, for MFU.
//!
//! MFU = model FLOPs of the step / (step time x GEMM peak). Model FLOPs count the products
//! the model needs, not what the implementation happens to do (no recompute, no padding
//! tricks):
//!
//! ```text
//! linear [out, in] over n rows     forward 2 n in out
//! attention, one sequence of s     forward 4 s^2 h hd (full), 2 s^2 h hd (causal)
//! backward of a part that trains   2 x its forward (d input and d weight)
//! backward a gradient only passes  1 x its forward (d input only)
//! ```
//!
//! The peak is measured at start-up ([`gemm_peak`]): the best of a few square GEMMs at the
//! run's precision through the same `ops::gemm` entry point the model's layers use, so MFU
//! compares the step with what this machine's GEMM reaches today, not with a datasheet.

use crate::model::batch::Batch;
use crate::model::{DeviceCtx, Mistral3Config, Part};
use crate::train::data::loader::BatchShape;
use cannon_kernels::gemm::{Dims, Trans};
use cannon_kernels::{ops, KernelError, Precision, Tensor};
use cannon_runtime::Float;
use std::time::Instant;

/// Forward FLOPs of each part for one batch, and the backward factor that applies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepFlops {
    pub vision: f64,
    pub projector: f64,
    pub text: f64,
    /// Forward + backward of the step with the given trainable parts.
    pub total: f64,
}

/// Model FLOPs of one forward + backward of `batch` with `trainable` parts training.
pub fn step_flops(cfg: &Mistral3Config, batch: &Batch, trainable: &[Part]) -> StepFlops {
    let ends = batch.sequence_ends();
    flops_of(cfg, batch.tokens(), &ends, &batch.images.sizes, trainable)
}

/// [`step_flops`] of the batch `shape` describes, before its images are read.
pub fn shape_flops(cfg: &Mistral3Config, shape: &BatchShape, trainable: &[Part]) -> StepFlops {
    let (ends, sizes) = (&shape.sequence_ends, &shape.image_sizes);
    flops_of(cfg, shape.tokens(), ends, sizes, trainable)
}

/// The FLOPs of a batch of `tokens` tokens (padding included) in sequences ending at
/// `ends`, with images of `image_sizes`.
fn flops_of(
    cfg: &Mistral3Config,
    tokens: usize,
    ends: &[usize],
    image_sizes: &[(usize, usize)],
    trainable: &[Part],
) -> StepFlops {
    let t = &cfg.text_config;
    let v = &cfg.vision_config;
    let (d, it, vocab) = (
        t.hidden_size as f64,
        t.intermediate_size as f64,
        t.vocab_size as f64,
    );
    let (hq, hkv, hd) = (
        t.num_attention_heads as f64,
        t.num_key_value_heads as f64,
        t.head_dim() as f64,
    );
    let text_linear = d * hq * hd * 2.0 + d * hkv * hd * 2.0 + 3.0 * d * it;
    let tokens = tokens as f64;
    let mut text = 2.0 * tokens * (text_linear * t.num_hidden_layers as f64 + d * vocab);
    let mut start = 0;
    for &end in ends {
        let s = (end - start) as f64;
        text += 2.0 * s * s * hq * hd * t.num_hidden_layers as f64;
        start = end;
    }

    let (dv, iv, p, c) = (
        v.hidden_size as f64,
        v.intermediate_size as f64,
        v.patch_size,
        v.num_channels as f64,
    );
    let (hv, hdv) = (v.num_attention_heads as f64, v.head_dim() as f64);
    let layers = cfg.vision_layers_used() as f64;
    let m2 = (cfg.spatial_merge_size * cfg.spatial_merge_size) as f64;
    let (mut vision, mut projector) = (0.0, 0.0);
    for &(h, w) in image_sizes {
        let n = ((h / p) * (w / p)) as f64;
        vision += 2.0 * n * c * (p * p) as f64 * dv;
        vision +=
            layers * (2.0 * n * (4.0 * dv * hv * hdv + 3.0 * dv * iv) + 4.0 * n * n * hv * hdv);
        let merged = n / m2;
        projector += 2.0 * merged * (m2 * dv * dv + dv * d + d * d);
    }

    let trains = |part| trainable.contains(&part);
    let vision_bwd = if trains(Part::Vision) { 2.0 } else { 0.0 };
    let projector_bwd = if trains(Part::Projector) {
        2.0
    } else if trains(Part::Vision) {
        1.0
    } else {
        0.0
    };
    let text_bwd = if trains(Part::Text) {
        2.0
    } else if projector_bwd > 0.0 {
        1.0
    } else {
        0.0
    };
    StepFlops {
        vision,
        projector,
        text,
        total: vision * (1.0 + vision_bwd)
            + projector * (1.0 + projector_bwd)
            + text * (1.0 + text_bwd),
    }
}

/// The best FLOP/s of `reps` square `n^3` GEMMs at precision `p` on `exec`'s device (one
/// warm-up call first). At bf16 the operands are bf16, as the model's activations and cast
/// weights are: the peak is the rate of the products the model runs, not of an f32 -> bf16
/// rounding of the inputs that the model does once per tensor, elsewhere.
pub fn gemm_peak(
    exec: &DeviceCtx,
    p: Precision,
    n: usize,
    reps: usize,
) -> Result<f64, KernelError> {
    match p {
        Precision::F32 => gemm_peak_of::<f32>(exec, p, n, reps),
        Precision::Bf16 => gemm_peak_of::<half::bf16>(exec, p, n, reps),
    }
}

fn gemm_peak_of<T: Float>(
    exec: &DeviceCtx,
    p: Precision,
    n: usize,
    reps: usize,
) -> Result<f64, KernelError> {
    GemmProbe::<T>::new(exec, p, n)?.best(reps)
}

/// The operands of an `n^3` GEMM at precision `p`, kept for repeated peak measurements
/// (`bench step` probes beside every step) without allocating or uploading them again.
pub struct GemmProbe<T: Float> {
    exec: DeviceCtx,
    p: Precision,
    n: usize,
    a: Tensor<T>,
    b: Tensor<T>,
    c: Tensor<f32>,
}

impl<T: Float> GemmProbe<T> {
    pub fn new(exec: &DeviceCtx, p: Precision, n: usize) -> Result<Self, KernelError> {
        Ok(GemmProbe {
            exec: exec.clone(),
            p,
            n,
            a: exec.upload(&vec![T::from_f32(0.5); n * n], &[n, n])?,
            b: exec.upload(&vec![T::from_f32(0.25); n * n], &[n, n])?,
            c: exec.empty::<f32>(&[n, n])?,
        })
    }

    /// The best FLOP/s of `reps` calls, after one warm-up call.
    pub fn best(&mut self, reps: usize) -> Result<f64, KernelError> {
        let (st, n) = (self.exec.stream(), self.n);
        let dims = Dims { m: n, n, k: n };
        let mut best = f64::INFINITY;
        for i in 0..=reps.max(1) {
            let t0 = Instant::now();
            ops::gemm(
                st,
                self.p,
                Trans::N,
                Trans::T,
                dims,
                1.0,
                &self.a.view(),
                n,
                &self.b.view(),
                n,
                0.0,
                &mut self.c.view_mut(),
                n,
            )?;
            st.synchronize()?;
            let dt = t0.elapsed().as_secs_f64();
            if i > 0 {
                best = best.min(dt);
            }
        }
        Ok(2.0 * (n as f64).powi(3) / best.max(1e-9))
    }
}
