//! Test helpers shared by the op tests: element conversion, tolerance checks with a readable
//! failure message, and central finite differences in f64.

use crate::testutil::{max_abs, rel_l2, Rng};
use crate::tolerance::Tolerances;
use cannon_runtime::Float;

/// Relative L2 bounds from DESIGN.md (the crate's [`Tolerances`] table), per storage type:
/// (forward, backward).
pub(crate) fn tolerances<E: Float>() -> (f64, f64) {
    let t = if E::NAME == "f32" {
        Tolerances::F32
    } else {
        Tolerances::BF16
    };
    (t.forward, t.grad)
}

/// `n` normal samples scaled by `scale`, stored as `E` (so bf16 data is exactly representable
/// and the f64 reference sees the same inputs as the kernel).
pub(crate) fn randn<E: Float>(rng: &mut Rng, n: usize, scale: f32) -> Vec<E> {
    rng.normal_vec(n, scale)
        .into_iter()
        .map(E::from_f32)
        .collect()
}

/// Widens to f64 for the references.
pub(crate) fn wide<E: Float>(a: &[E]) -> Vec<f64> {
    a.iter().map(|&x| x.to_f32() as f64).collect()
}

/// Asserts `rel_l2(got, want) <= tol`, naming the tensor and the case on failure.
pub(crate) fn assert_close<E: Float>(what: &str, got: &[E], want: &[f64], tol: f64) {
    let g = wide(got);
    let err = rel_l2(&g, want);
    assert!(
        err <= tol,
        "{what}: rel L2 {err:.3e} > {tol:.1e} (max abs diff {:.3e}, len {})",
        max_abs(&g, want),
        want.len()
    );
}

/// Central finite differences of a scalar function of `x` (f64), step `h` per element.
pub(crate) fn fd_grad(x: &[f64], h: f64, mut f: impl FnMut(&[f64]) -> f64) -> Vec<f64> {
    let mut xp = x.to_vec();
    (0..x.len())
        .map(|i| {
            xp[i] = x[i] + h;
            let up = f(&xp);
            xp[i] = x[i] - h;
            let down = f(&xp);
            xp[i] = x[i];
            (up - down) / (2.0 * h)
        })
        .collect()
}

/// `sum_i a[i] * b[i]` in f64 (the scalar loss `<dy, y>` whose gradient is `dy`'s backward).
pub(crate) fn dot64(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
