//! Quick GEMM rate table (no criterion): `cargo run -p cannon-kernels --release --example
//! gemm_rate [-- FILTER]`. Prints GFLOP/s (2*m*n*k per product, best of a few runs) for the
//! bench-config shapes (hidden 512, intermediate 1536, vocab 32768, 2048 tokens) and a large
//! square, f32 and bf16.

use cannon_kernels::gemm::{gemm_bf16, gemm_bf16_portable, gemm_f32, Dims, Trans};
use cannon_kernels::testutil::Rng;
use half::bf16;
use std::time::Instant;

struct Shape {
    name: &'static str,
    ta: Trans,
    tb: Trans,
    m: usize,
    n: usize,
    k: usize,
}

fn shapes() -> Vec<Shape> {
    let s = |name, ta, tb, m, n, k| Shape {
        name,
        ta,
        tb,
        m,
        n,
        k,
    };
    use Trans::{N, T};
    vec![
        s("square 2048^3 NN", N, N, 2048, 2048, 2048),
        s("mlp fwd  X W^T   2048x512->1536", N, T, 2048, 1536, 512),
        s("mlp dX   dY W    2048x1536->512", N, N, 2048, 512, 1536),
        s("mlp dW   dY^T X  1536x2048->512", T, N, 1536, 512, 2048),
        s("head fwd X W^T   2048x512->32768", N, T, 2048, 32768, 512),
        s("head dX  dY W    2048x32768->512", N, N, 2048, 512, 32768),
        s("head dW  dY^T X  32768x2048->512", T, N, 32768, 512, 2048),
    ]
}

fn stored(t: Trans, r: usize, c: usize) -> (usize, usize) {
    match t {
        Trans::N => (r, c),
        Trans::T => (c, r),
    }
}

/// Best-of-`reps` seconds of `f` after one warm-up call.
fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let filter = std::env::args().nth(1).unwrap_or_default();
    let mut rng = Rng::new(1);
    println!(
        "threads {}  avx512bf16 kernel {}",
        rayon::current_num_threads(),
        cannon_kernels::gemm::bf16_kernel_available()
    );
    println!(
        "{:<36} {:>10} {:>10} {:>14}",
        "shape (m x n x k)", "f32", "bf16", "bf16 portable"
    );
    for sh in shapes() {
        if !sh.name.contains(filter.as_str()) {
            continue;
        }
        let d = Dims {
            m: sh.m,
            n: sh.n,
            k: sh.k,
        };
        let (ar, ac) = stored(sh.ta, sh.m, sh.k);
        let (br, bc) = stored(sh.tb, sh.k, sh.n);
        let a = rng.normal_vec(ar * ac, 1.0);
        let b = rng.normal_vec(br * bc, 1.0);
        let ah: Vec<bf16> = a.iter().map(|&x| bf16::from_f32(x)).collect();
        let bh: Vec<bf16> = b.iter().map(|&x| bf16::from_f32(x)).collect();
        let mut c = vec![0.0f32; sh.m * sh.n];
        let flop = 2.0 * (sh.m * sh.n * sh.k) as f64;
        let reps = ((2e11 / flop) as usize).clamp(2, 20);
        let t32 = time(reps, || {
            gemm_f32(sh.ta, sh.tb, d, 1.0, &a, ac, &b, bc, 0.0, &mut c, sh.n).unwrap()
        });
        let t16 = time(reps, || {
            gemm_bf16(sh.ta, sh.tb, d, 1.0, &ah, ac, &bh, bc, 0.0, &mut c, sh.n).unwrap()
        });
        let tp = if std::env::var_os("PORTABLE").is_some() {
            time(2, || {
                gemm_bf16_portable(sh.ta, sh.tb, d, 1.0, &ah, ac, &bh, bc, 0.0, &mut c, sh.n)
                    .unwrap()
            })
        } else {
            f64::NAN
        };
        println!(
            "{:<36} {:>10.1} {:>10.1} {:>14.1}",
            sh.name,
            flop / t32 / 1e9,
            flop / t16 / 1e9,
            flop / tp / 1e9
        );
    }
}
