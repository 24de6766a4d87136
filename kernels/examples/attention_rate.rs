//! Attention timing table (no criterion), for side-by-side comparisons on a noisy machine:
//! `cargo run -p cannon-kernels --release --example attention_rate [-- ITERS [FILTER]]`.
//!
//! Shapes of the bench config: text = 2 x 1024 tokens, 8 q heads x 64, 2 kv heads (GQA 4:1),
//! causal; vision = one 256-patch image, 4 heads x 64, full. f32. For each, the forward alone
//! and forward + backward, timed ITERS times (default 20, 5x as many for shapes under 1024
//! tokens) after a warm-up;
//! prints the median and the minimum wall time and the GFLOP/s of the median (FLOPs of the
//! products only: 4 * pairs * D forward, 10 * pairs * D backward, pairs = query-key pairs
//! the mask lets through).
//!
//! After them, the text shape again as ring attention's blocks (`block_forward_merge`,
//! `block_backward_accumulate`): each sequence cut in two chunks, the diagonal blocks causal
//! and the second chunk's queries against the first chunk's keys in full, the same
//! query-key pairs as the varlen call, so the two rows compare per FLOP.
//!
//! The PyTorch baseline in the kernels docs was timed the same way (median and minimum of 20
//! runs after 3 warm-ups, 2 threads) on `torch.nn.functional.scaled_dot_product_attention`
//! with q/k/v of shape [B, H, S, D], `is_causal` and `enable_gqa` set as above, and
//! `out.backward(dout)` for forward + backward; run both back to back, several times.

use std::time::Instant;

use cannon_kernels::attention::{
    host::backward, host::block_backward_accumulate, host::block_forward_merge, host::forward,
    BlockAttention, BlockPair, Qkv, QkvGrad, VarlenAttention,
};
use cannon_kernels::testutil::{attention_bench_shapes, AttentionShape, Rng};

/// (median, min) seconds of `iters` runs of `f` after 3 warm-ups.
fn time(iters: usize, mut f: impl FnMut()) -> (f64, f64) {
    for _ in 0..3 {
        f();
    }
    let mut ts: Vec<f64> = (0..iters)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    ts.sort_by(|a, b| a.total_cmp(b));
    if std::env::var_os("SPREAD").is_some() {
        let q = |f: f64| ts[((ts.len() - 1) as f64 * f) as usize] * 1e3;
        println!(
            "  ms p10 {:.3} p25 {:.3} p50 {:.3} p75 {:.3} p90 {:.3}",
            q(0.1),
            q(0.25),
            q(0.5),
            q(0.75),
            q(0.9)
        );
    }
    (ts[ts.len() / 2], ts[0])
}

fn main() {
    let iters: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
        .max(1);
    let filter = std::env::args().nth(2).unwrap_or_default();
    println!("threads {}", rayon::current_num_threads());
    println!(
        "{:<34} {:>24} {:>24}",
        "shape (f32)", "fwd median/min ms", "fwd+bwd median/min ms"
    );
    let mut rng = Rng::new(1);
    for s in attention_bench_shapes()
        .iter()
        .filter(|s| s.name.contains(filter.as_str()))
    {
        let t = *s.cu.last().unwrap_or(&0);
        let a = VarlenAttention::new(&s.cu, t, s.hq, s.hkv, s.d, s.causal);
        let q = rng.normal_vec(t * s.hq * s.d, 1.0);
        let k = rng.normal_vec(t * s.hkv * s.d, 1.0);
        let v = rng.normal_vec(t * s.hkv * s.d, 1.0);
        let dout = rng.normal_vec(t * s.hq * s.d, 1.0);
        let x = Qkv {
            q: &q,
            k: &k,
            v: &v,
        };
        let mut out = vec![0.0f32; q.len()];
        let mut lse = vec![0.0f32; t * s.hq];
        let (mut dq, mut dk, mut dv) = (out.clone(), k.clone(), v.clone());
        // Small shapes (the vision one is ~30x cheaper) get more runs for the same confidence.
        let n = if t < 1024 { iters * 5 } else { iters };
        let fwd = time(n, || {
            if let Err(e) = forward(&a, x, &mut out, &mut lse) {
                panic!("forward: {e}");
            }
        });
        let both = time(n, || {
            let r = forward(&a, x, &mut out, &mut lse).and_then(|()| {
                let g = QkvGrad {
                    dq: &mut dq,
                    dk: &mut dk,
                    dv: &mut dv,
                };
                backward(&a, x, &out, &lse, &dout, g)
            });
            if let Err(e) = r {
                panic!("forward + backward: {e}");
            }
        });
        report(s.name, s, fwd, both);
    }
    ring_rows(iters, &filter, &mut rng);
}

/// The text shape as ring blocks (see the module docs).
fn ring_rows(iters: usize, filter: &str, rng: &mut Rng) {
    for s in attention_bench_shapes()
        .iter()
        .filter(|s| s.causal && format!("ring_{}", s.name).contains(filter))
    {
        let t = *s.cu.last().unwrap_or(&0);
        let mut pairs = Vec::new();
        let mut start = 0;
        for &end in &s.cu {
            let mid = start + (end - start) / 2;
            let (a, b) = (start..mid, mid..end);
            pairs.push(BlockPair {
                q: a.clone(),
                k: a.clone(),
                causal: true,
            });
            pairs.push(BlockPair {
                q: b.clone(),
                k: b.clone(),
                causal: true,
            });
            pairs.push(BlockPair {
                q: b,
                k: a,
                causal: false,
            });
            start = end;
        }
        let a = BlockAttention {
            pairs: &pairs,
            q_tokens: t,
            k_tokens: t,
            q_heads: s.hq,
            kv_heads: s.hkv,
            head_dim: s.d,
            scale: 1.0 / (s.d as f32).sqrt(),
        };
        let q = rng.normal_vec(t * s.hq * s.d, 1.0);
        let k = rng.normal_vec(t * s.hkv * s.d, 1.0);
        let v = rng.normal_vec(t * s.hkv * s.d, 1.0);
        let dout = rng.normal_vec(t * s.hq * s.d, 1.0);
        let mut out = vec![0.0f32; q.len()];
        let mut lse = vec![f32::NEG_INFINITY; t * s.hq];
        let (mut dq, mut dk, mut dv) = (out.clone(), k.clone(), v.clone());
        let fwd_once = |out: &mut Vec<f32>, lse: &mut Vec<f32>| {
            out.fill(0.0);
            lse.fill(f32::NEG_INFINITY);
            if let Err(e) = block_forward_merge(&a, &q, &k, &v, out, lse) {
                panic!("block forward: {e}");
            }
        };
        let fwd = time(iters, || fwd_once(&mut out, &mut lse));
        let both = time(iters, || {
            fwd_once(&mut out, &mut lse);
            if let Err(e) = block_backward_accumulate(
                &a,
                (&q, &k, &v),
                &out,
                &lse,
                &dout,
                &mut dq,
                &mut dk,
                &mut dv,
            ) {
                panic!("block backward: {e}");
            }
        });
        report(&format!("ring_{}", s.name), s, fwd, both);
    }
}

/// Prints a row: times and the GFLOP/s of the products over the query-key pairs the mask
/// lets through (4 * pairs * D forward, 10 * pairs * D more backward).
fn report(name: &str, s: &AttentionShape, fwd: (f64, f64), both: (f64, f64)) {
    let pairs: f64 =
        s.cu.iter()
            .scan(0, |start, &end| {
                let len = (end - *start) as f64;
                *start = end;
                Some(if s.causal {
                    len * (len + 1.0) / 2.0
                } else {
                    len * len
                })
            })
            .sum::<f64>()
            * s.hq as f64;
    let flop_f = 4.0 * pairs * s.d as f64;
    let flop_b = flop_f + 10.0 * pairs * s.d as f64;
    let ms = |t: (f64, f64)| format!("{:.3} / {:.3}", t.0 * 1e3, t.1 * 1e3);
    println!(
        "{:<34} {:>24} {:>24}   ({:.0} / {:.0} GFLOP/s)",
        name,
        ms(fwd),
        ms(both),
        flop_f / fwd.0 / 1e9,
        flop_b / both.0 / 1e9
    );
}
