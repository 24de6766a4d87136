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
//! The peak is measured at start-up ([`PeakProbe::measure`]): the best of four square
//! 2048^3 GEMMs (8192^3 on an NPU) at the run's precision through the same `ops::gemm` entry
//! point the model's layers use, so MFU compares the step with what this machine's GEMM
//! reaches today, not with a datasheet. A step whose model FLOP rate beats the probe (a
//! probe taken while the host was busy) raises the peak to that rate, so `mfu` is never
//! above 1. Model FLOPs count the samples' tokens only: padding is no work the model needs.

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

/// Model FLOPs of one forward + backward of `batch` with `trainable` parts training, every
/// token counted (a batch does not say which are padding; `bench step`'s have none).
pub fn step_flops(cfg: &Mistral3Config, batch: &Batch, trainable: &[Part]) -> StepFlops {
    let ends = batch.sequence_ends();
    let lens = ends.iter().scan(0, |start, &end| {
        let len = end - *start;
        *start = end;
        Some(len)
    });
    flops_of(cfg, lens, &batch.images.sizes, trainable)
}

/// The model FLOPs of a run's step (what its `mfu` divides): of the samples of the batch
/// `shape` describes, padding excluded (a padded row's tail is no work the model needs),
/// known before its images are read.
pub fn shape_flops(cfg: &Mistral3Config, shape: &BatchShape, trainable: &[Part]) -> StepFlops {
    let lens = shape.sample_lens.iter().copied();
    flops_of(cfg, lens, &shape.image_sizes, trainable)
}

/// The FLOPs of sequences of `seq_lens` tokens (each attending causally within itself),
/// with images of `image_sizes`.
fn flops_of(
    cfg: &Mistral3Config,
    seq_lens: impl Iterator<Item = usize>,
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
    let mut text = 0.0;
    for s in seq_lens {
        let s = s as f64;
        text += 2.0 * s * (text_linear * t.num_hidden_layers as f64 + d * vocab);
        text += 2.0 * s * s * hq * hd * t.num_hidden_layers as f64;
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

/// Side of the square GEMMs the peak is measured on: large enough that the best of a few
/// calls is the micro-kernel's sustained rate (at 1024 one call is ~10 ms on 2 cores and the
/// best of four varied by 30 % between runs on an AVX2 Zen 3; at 2048 by a few %), small
/// enough to take about half a second. A run's start-up once probed 512^3 products: on a
/// busy 2-core host that read 151.7 GFLOP/s where `bench step` read 200, and the 0.86 B
/// model's second step logged `mfu` 1.07.
pub const GEMM_PEAK_N: usize = 2048;

/// The side on an NPU: its cube units finish a 2048^3 product in well under a millisecond,
/// where the launch and the stream's synchronisation would be most of what is timed.
pub const NPU_GEMM_PEAK_N: usize = 8192;

/// The peak a run's MFU divides by, as measured at its start (recorded in
/// `run_identity.json`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PeakProbe {
    /// The best rate, GFLOP/s.
    pub gflops: f64,
    /// Side of the square products timed.
    pub n: usize,
    /// Products timed after the warm-up one (the best counts).
    pub reps: usize,
    /// Precision of the operands (the run's `train.dtype`).
    pub dtype: String,
    pub device: String,
}

impl PeakProbe {
    /// Probes the run's device at precision `p`: the best of 4 square products of
    /// [`GEMM_PEAK_N`] ([`NPU_GEMM_PEAK_N`] on an NPU) through `ops::gemm`.
    pub fn measure(exec: &DeviceCtx, p: Precision) -> Result<Self, KernelError> {
        let device = exec.device();
        let n = match device.runs_inline() {
            true => GEMM_PEAK_N,
            false => NPU_GEMM_PEAK_N,
        };
        let reps = 4;
        Ok(PeakProbe {
            gflops: gemm_peak(exec, p, n, reps)? / 1e9,
            n,
            reps,
            dtype: format!("{p:?}").to_lowercase(),
            device: device.to_string(),
        })
    }

    pub fn flops(&self) -> f64 {
        self.gflops * 1e9
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::config::preset;

    #[test]
    fn a_runs_model_flops_leave_the_padding_out() {
        let tiny = preset::sizes("tiny").unwrap();
        let cfg = preset::config(tiny, 1280, 10, 14).unwrap();
        let text = [Part::Text];
        // Two rows of 16: samples of 3 and 5 tokens, each row padded to the end.
        let shape = BatchShape {
            rows: 2,
            seq: 16,
            sequence_ends: vec![3, 16, 21, 32],
            image_sizes: vec![],
            samples: 2,
            sample_tokens: 8,
            sample_lens: vec![3, 5],
        };
        let model = shape_flops(&cfg, &shape, &text).total;
        let samples = flops_of(&cfg, [3, 5].into_iter(), &[], &text).total;
        let with_padding = flops_of(&cfg, [3, 13, 5, 11].into_iter(), &[], &text).total;
        assert_eq!(model, samples);
        assert!(model < 0.5 * with_padding, "{model} vs {with_padding}");
    }
}
