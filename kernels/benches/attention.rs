//! Fused varlen attention on the bench config's shapes, f32 and bf16:
//! (a) text: 2 sequences x 1024 tokens, 8 q heads x 64, 2 kv heads (GQA 4:1), causal;
//! (b) vision: one 256-patch image, 4 heads x 64, full attention.
//! Each as forward alone and forward + backward.
//!
//! `cargo bench -p cannon-kernels --bench attention`

use std::hint::black_box;
use std::time::Duration;

use cannon_kernels::attention::{host::backward, host::forward, Qkv, QkvGrad, VarlenAttention};
use cannon_kernels::testutil::{attention_bench_shapes, AttentionShape as Shape, Rng};
use cannon_runtime::Float;
use criterion::{criterion_group, criterion_main, Criterion};

fn bench_shape<E: Float>(c: &mut Criterion, s: &Shape, dtype: &str) {
    let t = *s.cu.last().unwrap_or(&0);
    let a = VarlenAttention::new(&s.cu, t, s.hq, s.hkv, s.d, s.causal);
    let mut rng = Rng::new(1);
    let mut gen = |n: usize| -> Vec<E> {
        rng.normal_vec(n, 1.0)
            .into_iter()
            .map(E::from_f32)
            .collect()
    };
    let (q, k, v, dout) = (
        gen(t * s.hq * s.d),
        gen(t * s.hkv * s.d),
        gen(t * s.hkv * s.d),
        gen(t * s.hq * s.d),
    );
    let x = Qkv {
        q: &q,
        k: &k,
        v: &v,
    };
    let mut out = vec![E::from_f32(0.0); q.len()];
    let mut lse = vec![0.0f32; t * s.hq];
    let (mut dq, mut dk, mut dv) = (out.clone(), k.clone(), v.clone());

    c.bench_function(&format!("attention/{}/{dtype}/fwd", s.name), |b| {
        b.iter(|| forward(&a, x, black_box(&mut out), &mut lse).unwrap())
    });
    c.bench_function(&format!("attention/{}/{dtype}/fwd+bwd", s.name), |b| {
        b.iter(|| {
            forward(&a, x, &mut out, &mut lse).unwrap();
            let g = QkvGrad {
                dq: &mut dq,
                dk: &mut dk,
                dv: &mut dv,
            };
            backward(&a, x, &out, &lse, &dout, g).unwrap();
            black_box(&dq);
        })
    });
}

fn attention(c: &mut Criterion) {
    for s in attention_bench_shapes() {
        bench_shape::<f32>(c, &s, "f32");
        bench_shape::<half::bf16>(c, &s, "bf16");
    }
}

criterion_group! {
    name = benches;
    // The machine is shared: few, short samples; compare figures side by side, not absolutely.
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = attention
}
criterion_main!(benches);
