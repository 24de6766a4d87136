//! Quick GEMM rate table (no criterion):
//! `cargo run -p cannon-kernels --release --example gemm_rate [-- FILTER]` (env `PORTABLE=1`
//! adds the bf16 fallback column, `ROUNDS=n` sets the interleaved rounds, default 3). Prints
//! GFLOP/s (2*m*n*k per product, best over the rounds of a few runs each) for
//! the bench-config shapes (hidden 512, intermediate 1536, vocab 32768, 2048 tokens) and a large
//! square, f32 and bf16, plus one core's FMA / `vdpbf16ps` peak measured the same way.
//!
//! Each rate is given twice: by wall time, and by process CPU time per thread. On a machine
//! shared with other jobs the wall time also counts the slices the others took; the CPU time
//! counts only ours (plus rayon's idle spinning, so it errs low), i.e. what the kernel does on
//! the cores it actually gets.

use cannon_kernels::gemm::{
    host::gemm_bf16, host::gemm_bf16_portable, host::gemm_f32, Dims, Trans,
};
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

/// CPU time consumed so far by all threads of this process, in seconds.
fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return f64::NAN;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// (best wall seconds, best CPU seconds per thread) of `reps` runs of `f` after a warm-up.
fn time(reps: usize, threads: usize, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let (mut wall, mut cpu) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..reps {
        let (t, c) = (Instant::now(), cpu_seconds());
        f();
        wall = wall.min(t.elapsed().as_secs_f64());
        cpu = cpu.min((cpu_seconds() - c) / threads as f64);
    }
    (wall, cpu)
}

/// One thread issuing independent `vfmadd231ps` / `vdpbf16ps` on zmm registers: the core's
/// peak for each kernel.
#[cfg(target_arch = "x86_64")]
mod peak {
    use std::arch::x86_64::*;

    const ACC: usize = 24;
    const ITERS: usize = 2_000_000;

    #[target_feature(enable = "avx512f")]
    #[clippy::msrv = "1.89"]
    unsafe fn fma(x: f32) -> f32 {
        let a = _mm512_set1_ps(x);
        let mut acc = [_mm512_setzero_ps(); ACC];
        for _ in 0..ITERS {
            for r in acc.iter_mut() {
                *r = _mm512_fmadd_ps(a, a, *r);
            }
        }
        let s = acc
            .iter()
            .fold(_mm512_setzero_ps(), |s, &r| _mm512_add_ps(s, r));
        _mm512_reduce_add_ps(s)
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    #[clippy::msrv = "1.89"]
    unsafe fn dp(x: i32) -> f32 {
        let a: __m512bh = std::mem::transmute(_mm512_set1_epi32(x));
        let mut acc = [_mm512_setzero_ps(); ACC];
        for _ in 0..ITERS {
            for r in acc.iter_mut() {
                *r = _mm512_dpbf16_ps(*r, a, a);
            }
        }
        let s = acc
            .iter()
            .fold(_mm512_setzero_ps(), |s, &r| _mm512_add_ps(s, r));
        _mm512_reduce_add_ps(s)
    }

    /// [(f32 FMA wall, cpu), (bf16 dot wall, cpu)] FLOP/s of one thread.
    pub fn rates() -> Option<[(f64, f64); 2]> {
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")) {
            return None;
        }
        let flop_f = (ITERS * ACC * 32) as f64;
        let flop_b = (ITERS * ACC * 64) as f64;
        let x = std::hint::black_box(1e-30f32);
        let pair = std::hint::black_box(0x0001_0001);
        // SAFETY: avx512f was detected above.
        let (wf, cf) = super::time(3, 1, || {
            std::hint::black_box(unsafe { fma(std::hint::black_box(x)) });
        });
        // SAFETY: avx512f and avx512bf16 were detected above.
        let (wb, cb) = super::time(3, 1, || {
            std::hint::black_box(unsafe { dp(std::hint::black_box(pair)) });
        });
        Some([(flop_f / wf, flop_f / cf), (flop_b / wb, flop_b / cb)])
    }
}

fn main() {
    let filter = std::env::args().nth(1).unwrap_or_default();
    let threads = rayon::current_num_threads();
    println!(
        "threads {threads}  avx512bf16 kernel {}",
        cannon_kernels::gemm::bf16_kernel_available()
    );
    #[cfg(target_arch = "x86_64")]
    if let Some([f, b]) = peak::rates() {
        println!(
            "one-thread peak GFLOP/s (wall / cpu): f32 fma {:.1} / {:.1}, bf16 dot {:.1} / {:.1}",
            f.0 / 1e9,
            f.1 / 1e9,
            b.0 / 1e9,
            b.1 / 1e9
        );
    }
    println!("GFLOP/s by wall time / by CPU time per thread; % = wall rate / the square's");
    println!(
        "{:<36} {:>15} {:>6} {:>15} {:>6} {:>15}",
        "shape", "f32", "%", "bf16", "%", "bf16 portable"
    );
    let mut rng = Rng::new(1);
    let cases: Vec<Case> = shapes()
        .into_iter()
        .filter(|sh| sh.name.contains(filter.as_str()) || sh.name.starts_with("square"))
        .map(|sh| Case::new(sh, &mut rng))
        .collect();
    // Interleaved rounds: a drift in the machine's speed (other tenants, clocks) then touches
    // every shape alike instead of whichever shape happened to run during it.
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let mut best = vec![[(f64::INFINITY, f64::INFINITY); 3]; cases.len()];
    for _ in 0..rounds {
        for (case, best) in cases.iter().zip(&mut best) {
            for (b, t) in best.iter_mut().zip(case.run(threads)) {
                *b = (b.0.min(t.0), b.1.min(t.1));
            }
        }
    }
    let square = cases
        .iter()
        .zip(&best)
        .find(|(c, _)| c.sh.name.starts_with("square"))
        .map(|(c, b)| [c.flop / b[0].0, c.flop / b[1].0]);
    for (case, b) in cases.iter().zip(&best) {
        let flop = case.flop;
        let g = |t: (f64, f64)| {
            if t.0.is_finite() {
                format!("{:.1} / {:.1}", flop / t.0 / 1e9, flop / t.1 / 1e9)
            } else {
                "-".into()
            }
        };
        let pct = |t: (f64, f64), i: usize| match square {
            Some(sq) => format!("{:.1}", 100.0 * flop / t.0 / sq[i]),
            None => "-".into(),
        };
        println!(
            "{:<36} {:>15} {:>6} {:>15} {:>6} {:>15}",
            case.sh.name,
            g(b[0]),
            pct(b[0], 0),
            g(b[1]),
            pct(b[1], 1),
            g(b[2])
        );
    }
}

/// One shape's operands, f32 and bf16.
struct Case {
    sh: Shape,
    a: Vec<f32>,
    b: Vec<f32>,
    ah: Vec<bf16>,
    bh: Vec<bf16>,
    flop: f64,
}

impl Case {
    fn new(sh: Shape, rng: &mut Rng) -> Case {
        let (ar, ac) = stored(sh.ta, sh.m, sh.k);
        let (br, bc) = stored(sh.tb, sh.k, sh.n);
        let a = rng.normal_vec(ar * ac, 1.0);
        let b = rng.normal_vec(br * bc, 1.0);
        let ah = a.iter().map(|&x| bf16::from_f32(x)).collect();
        let bh = b.iter().map(|&x| bf16::from_f32(x)).collect();
        let flop = 2.0 * (sh.m * sh.n * sh.k) as f64;
        Case {
            sh,
            a,
            b,
            ah,
            bh,
            flop,
        }
    }

    /// Best (wall, cpu) seconds of a few runs: f32, bf16, bf16 portable (NaN unless
    /// `PORTABLE` is set).
    fn run(&self, threads: usize) -> [(f64, f64); 3] {
        let sh = &self.sh;
        let d = Dims {
            m: sh.m,
            n: sh.n,
            k: sh.k,
        };
        let ac = stored(sh.ta, sh.m, sh.k).1;
        let bc = stored(sh.tb, sh.k, sh.n).1;
        let (a, b, ah, bh) = (&self.a, &self.b, &self.ah, &self.bh);
        let mut c = vec![0.0f32; sh.m * sh.n];
        let reps = ((2e11 / self.flop) as usize).clamp(3, 20);
        let t32 = time(reps, threads, || {
            gemm_f32(sh.ta, sh.tb, d, 1.0, a, ac, b, bc, 0.0, &mut c, sh.n).unwrap()
        });
        let t16 = time(reps, threads, || {
            gemm_bf16(sh.ta, sh.tb, d, 1.0, ah, ac, bh, bc, 0.0, &mut c, sh.n).unwrap()
        });
        let tp = if std::env::var_os("PORTABLE").is_some() {
            time(2, threads, || {
                gemm_bf16_portable(sh.ta, sh.tb, d, 1.0, ah, ac, bh, bc, 0.0, &mut c, sh.n).unwrap()
            })
        } else {
            (f64::NAN, f64::NAN)
        };
        [t32, t16, tp]
    }
}
