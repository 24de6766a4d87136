//! GEMM benchmarks on the bench-config shapes (shared/bench/mistral3-bench/config.json: hidden
//! 512, intermediate 1536, vocab 32768, 2048 tokens): each linear's forward `X W^T`, and its
//! backward `dY W` and `dY^T X`, for f32 and bf16, plus a 2048^3 square.
//!
//! `cargo bench -p cannon-kernels --bench gemm [-- FILTER]`. Throughput is
//! `Elements(2*m*n*k)`, so criterion's "elem/s" reads as FLOP/s.

use cannon_kernels::gemm::{host::gemm_bf16, host::gemm_f32, Dims, Trans};
use cannon_kernels::testutil::Rng;
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use half::bf16;
use std::time::Duration;

/// (name, op(A), op(B), m, n, k)
const SHAPES: &[(&str, Trans, Trans, usize, usize, usize)] = &[
    ("square_2048", Trans::N, Trans::N, 2048, 2048, 2048),
    (
        "mlp_fwd_XWt_2048x512x1536",
        Trans::N,
        Trans::T,
        2048,
        1536,
        512,
    ),
    (
        "mlp_dX_dYW_2048x1536x512",
        Trans::N,
        Trans::N,
        2048,
        512,
        1536,
    ),
    (
        "mlp_dW_dYtX_1536x2048x512",
        Trans::T,
        Trans::N,
        1536,
        512,
        2048,
    ),
    (
        "head_fwd_XWt_2048x512x32768",
        Trans::N,
        Trans::T,
        2048,
        32768,
        512,
    ),
    (
        "head_dX_dYW_2048x32768x512",
        Trans::N,
        Trans::N,
        2048,
        512,
        32768,
    ),
    (
        "head_dW_dYtX_32768x2048x512",
        Trans::T,
        Trans::N,
        32768,
        512,
        2048,
    ),
];

fn stored(t: Trans, r: usize, c: usize) -> (usize, usize) {
    match t {
        Trans::N => (r, c),
        Trans::T => (c, r),
    }
}

fn bench_gemm(cr: &mut Criterion) {
    let mut rng = Rng::new(7);
    for &(name, ta, tb, m, n, k) in SHAPES {
        let d = Dims { m, n, k };
        let (ar, ac) = stored(ta, m, k);
        let (br, bc) = stored(tb, k, n);
        let a = rng.normal_vec(ar * ac, 1.0);
        let b = rng.normal_vec(br * bc, 1.0);
        let ah: Vec<bf16> = a.iter().map(|&x| bf16::from_f32(x)).collect();
        let bh: Vec<bf16> = b.iter().map(|&x| bf16::from_f32(x)).collect();
        let mut c = vec![0.0f32; m * n];

        let mut g = cr.benchmark_group("gemm");
        g.throughput(Throughput::Elements(2 * (m * n * k) as u64));
        g.sample_size(10);
        // One product takes 10-500 ms: flat sampling, as criterion advises for long runs.
        g.sampling_mode(SamplingMode::Flat);
        g.warm_up_time(Duration::from_millis(500));
        g.measurement_time(Duration::from_secs(3));
        g.bench_function(format!("f32/{name}"), |bch| {
            bch.iter(|| gemm_f32(ta, tb, d, 1.0, &a, ac, &b, bc, 0.0, &mut c, n).unwrap())
        });
        g.bench_function(format!("bf16/{name}"), |bch| {
            bch.iter(|| gemm_bf16(ta, tb, d, 1.0, &ah, ac, &bh, bc, 0.0, &mut c, n).unwrap())
        });
        g.finish();
    }
}

criterion_group!(benches, bench_gemm);
criterion_main!(benches);
