//! Benchmarks of the non-GEMM ops on the CPU: `cargo bench -p cannon-kernels --bench ops`.
//!
//! Shapes: RMSNorm forward + backward on [2048, 512]; cross-entropy over 32768 classes for
//! 2048 rows (full, in place, and chunked by 256 rows); AdamW over 10M parameters; f32 <-> bf16
//! casts of 10M elements; SwiGLU, GELU and RoPE on activation-sized inputs. Throughputs are
//! in elements (rows x width) per second.

use cannon_kernels::adamw::{host::adamw_step, AdamW};
use cannon_kernels::cast::host::cast;
use cannon_kernels::cross_entropy::{
    host::cross_entropy, host::cross_entropy_chunked, host::cross_entropy_in_place, ChunkedLogits,
    LossNorm,
};
use cannon_kernels::gelu::{host::gelu_backward, host::gelu_forward};
use cannon_kernels::rmsnorm::{host::rmsnorm_backward, host::rmsnorm_forward};
use cannon_kernels::rope::{host::rope_forward, RopeTable};
use cannon_kernels::swiglu::{host::swiglu_backward, host::swiglu_forward};
use cannon_kernels::testutil::Rng;
use cannon_kernels::KernelError;
use cannon_runtime::Float;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use half::bf16;
use std::hint::black_box;
use std::ops::Range;
use std::time::Duration;

fn data<E: Float>(rng: &mut Rng, n: usize) -> Vec<E> {
    rng.normal_vec(n, 1.0)
        .into_iter()
        .map(E::from_f32)
        .collect()
}

fn rmsnorm<E: Float>(c: &mut Criterion) {
    let (t, d) = (2048, 512);
    let mut rng = Rng::new(1);
    let (x, w, dy) = (
        data::<E>(&mut rng, t * d),
        data::<E>(&mut rng, d),
        data::<E>(&mut rng, t * d),
    );
    let (mut out, mut rstd) = (vec![E::default(); t * d], vec![0.0f32; t]);
    let (mut dx, mut dw) = (vec![E::default(); t * d], vec![0.0f32; d]);
    let mut g = c.benchmark_group(format!("rmsnorm_{}", E::NAME));
    g.throughput(Throughput::Elements((t * d) as u64));
    g.bench_function("fwd_2048x512", |b| {
        b.iter(|| rmsnorm_forward(&mut out, &mut rstd, black_box(&x), &w, d, 1e-5).unwrap())
    });
    g.bench_function("fwd_bwd_2048x512", |b| {
        b.iter(|| {
            rmsnorm_forward(&mut out, &mut rstd, black_box(&x), &w, d, 1e-5).unwrap();
            rmsnorm_backward(&mut dx, &mut dw, &dy, &x, &w, &rstd, d).unwrap();
        })
    });
    g.finish();
}

/// Chunk producer for the bench: copies the chunk's rows out of a precomputed [N, V] buffer
/// (standing in for the lm_head GEMM) and ignores the gradient.
struct Copier<'a> {
    logits: &'a [f32],
    vocab: usize,
}

impl ChunkedLogits for Copier<'_> {
    type Error = KernelError;
    fn logits(&mut self, rows: Range<usize>, out: &mut [f32]) -> Result<(), KernelError> {
        out.copy_from_slice(&self.logits[rows.start * self.vocab..rows.end * self.vocab]);
        Ok(())
    }
    fn backward(&mut self, _rows: Range<usize>, d_logits: &[f32]) -> Result<(), KernelError> {
        black_box(d_logits);
        Ok(())
    }
}

fn cross_entropy_bench(c: &mut Criterion) {
    let (n, v) = (2048, 32768);
    let mut rng = Rng::new(2);
    let logits = rng.normal_vec(n * v, 2.0);
    let labels: Vec<i32> = (0..n).map(|_| rng.below(v) as i32).collect();
    let mut grad = vec![0.0f32; n * v];
    let mut g = c.benchmark_group("cross_entropy");
    g.throughput(Throughput::Elements((n * v) as u64));
    g.bench_function("full_loss_2048x32768", |b| {
        b.iter(|| cross_entropy(black_box(&logits), &labels, v, None, LossNorm::Mean).unwrap())
    });
    g.bench_function("full_grad_2048x32768", |b| {
        b.iter(|| {
            cross_entropy(
                black_box(&logits),
                &labels,
                v,
                Some(&mut grad),
                LossNorm::Mean,
            )
            .unwrap()
        })
    });
    g.bench_function("in_place_2048x32768", |b| {
        b.iter_batched_ref(
            || logits.clone(),
            |x| cross_entropy_in_place(x, &labels, v, LossNorm::Mean).unwrap(),
            criterion::BatchSize::LargeInput,
        )
    });
    g.bench_function("chunked256_grad_2048x32768", |b| {
        let mut p = Copier {
            logits: &logits,
            vocab: v,
        };
        b.iter(|| cross_entropy_chunked(&mut p, &labels, v, 256, LossNorm::Mean, true).unwrap())
    });
    g.finish();
}

fn adamw_bench(c: &mut Criterion) {
    let n = 10_000_000;
    let mut rng = Rng::new(3);
    let mut p = rng.normal_vec(n, 1.0);
    let grads = rng.normal_vec(n, 1e-3);
    let (mut m, mut v) = (vec![0.0f32; n], vec![0.0f32; n]);
    let mut g = c.benchmark_group("adamw");
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("step_10M", |b| {
        b.iter(|| {
            adamw_step(
                &mut p,
                black_box(&grads),
                &mut m,
                &mut v,
                10,
                &AdamW::default(),
            )
            .unwrap()
        })
    });
    g.finish();
}

fn casts(c: &mut Criterion) {
    let n = 10_000_000;
    let mut rng = Rng::new(4);
    let x = rng.normal_vec(n, 1.0);
    let mut y = vec![bf16::ZERO; n];
    let mut z = vec![0.0f32; n];
    let mut g = c.benchmark_group("cast");
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("f32_to_bf16_10M", |b| {
        b.iter(|| cast(black_box(&x), &mut y).unwrap())
    });
    g.bench_function("bf16_to_f32_10M", |b| {
        b.iter(|| cast(black_box(&y), &mut z).unwrap())
    });
    g.finish();
}

fn elementwise<E: Float>(c: &mut Criterion) {
    // One MLP activation of 2048 tokens x 4096 (the Pixtral intermediate size).
    let n = 2048 * 4096;
    let mut rng = Rng::new(5);
    let (a, b_, dh) = (
        data::<E>(&mut rng, n),
        data::<E>(&mut rng, n),
        data::<E>(&mut rng, n),
    );
    let (mut h, mut da, mut db) = (
        vec![E::default(); n],
        vec![E::default(); n],
        vec![E::default(); n],
    );
    let mut g = c.benchmark_group(format!("elementwise_{}", E::NAME));
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("swiglu_fwd_8M", |b| {
        b.iter(|| swiglu_forward(&mut h, black_box(&a), &b_).unwrap())
    });
    g.bench_function("swiglu_bwd_8M", |b| {
        b.iter(|| swiglu_backward(&mut da, &mut db, black_box(&dh), &a, &b_).unwrap())
    });
    g.bench_function("gelu_fwd_8M", |b| {
        b.iter(|| gelu_forward(&mut h, black_box(&a)).unwrap())
    });
    g.bench_function("gelu_bwd_8M", |b| {
        b.iter(|| gelu_backward(&mut da, black_box(&dh), &a).unwrap())
    });
    // RoPE on q of 2048 tokens x 32 heads x 128 (the Mistral text shape), packed positions.
    let (t, heads, d) = (2048, 32, 128);
    let table = RopeTable::text(d, 1e9, 2048).unwrap();
    let pos: Vec<u32> = (0..t as u32).map(|i| i % 1024).collect();
    let mut q = data::<E>(&mut rng, t * heads * d);
    g.throughput(Throughput::Elements((t * heads * d) as u64));
    g.bench_function("rope_fwd_2048x32x128", |b| {
        b.iter(|| rope_forward(&mut q, heads, &table, black_box(&pos)).unwrap())
    });
    g.finish();
}

fn config() -> Criterion {
    // A loaded 2-core machine: few samples, short windows; the figures are indicative.
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
}

fn all(c: &mut Criterion) {
    rmsnorm::<f32>(c);
    rmsnorm::<bf16>(c);
    cross_entropy_bench(c);
    adamw_bench(c);
    casts(c);
    elementwise::<f32>(c);
    elementwise::<bf16>(c);
}

criterion_group! {
    name = ops;
    config = config();
    targets = all
}
criterion_main!(ops);
