use super::host::{clip_grad_norm, clip_with_sum_squares, grad_sum_squares};
use crate::testutil::Rng;

/// torch's algorithm in f64, written out: per-tensor norms, the norm of the norms, the
/// clamped coefficient applied to every tensor.
fn reference(grads: &[Vec<f32>], max_norm: f64) -> (f64, Vec<Vec<f64>>) {
    let norms: Vec<f64> = grads
        .iter()
        .map(|g| g.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt())
        .collect();
    let total = norms.iter().map(|n| n * n).sum::<f64>().sqrt();
    let coef = (max_norm / (total + 1e-6)).min(1.0);
    (
        total,
        grads
            .iter()
            .map(|g| g.iter().map(|&x| x as f64 * coef).collect())
            .collect(),
    )
}

/// Slices of odd sizes (0, 1, around the lane widths, several rayon chunks).
fn grads(rng: &mut Rng, scale: f32) -> Vec<Vec<f32>> {
    [0usize, 1, 7, 8, 9, 1000, 100_003]
        .iter()
        .map(|&n| rng.normal_vec(n, scale))
        .collect()
}

#[test]
fn clips_like_torch() {
    let mut rng = Rng::new(70);
    for (scale, max_norm) in [(1.0f32, 1.0), (1e-3, 1.0), (1.0, 1e4), (3.0, 0.0)] {
        let mut g = grads(&mut rng, scale);
        let (want_norm, want) = reference(&g, max_norm);
        let norm = clip_grad_norm(&mut g, max_norm).unwrap();
        // f64 sums of f32 squares: only summation order differs from the reference.
        assert!(
            (norm - want_norm).abs() <= 1e-12 * want_norm,
            "{norm} vs {want_norm}"
        );
        for (a, r) in g.iter().zip(&want) {
            // One f32 multiply by an f32-rounded coefficient: within 2 f32 ulp.
            assert!(
                crate::testutil::rel_l2(a, r) <= 2.5e-7,
                "scale {scale}, max {max_norm}"
            );
        }
    }
}

#[test]
fn leaves_small_gradients_alone() {
    let mut g = vec![vec![3.0f32, 4.0]]; // norm 5
    let before = g.clone();
    let norm = clip_grad_norm(&mut g, 5.0 + 1e-3).unwrap();
    assert_eq!(norm, 5.0);
    assert_eq!(
        g, before,
        "coef >= 1: untouched (not multiplied by 1.0000x)"
    );
    let norm = clip_grad_norm(&mut g, 2.5).unwrap();
    assert_eq!(norm, 5.0);
    let expect = (2.5 / (5.0 + 1e-6)) as f32;
    assert_eq!(g[0], vec![3.0 * expect, 4.0 * expect]);
}

#[test]
fn sharded_equals_whole() {
    // Split the same gradients over 3 "ranks": the summed per-rank sums of squares give the
    // one-process norm up to f64 rounding of the grouping, and so the same f32 coefficient
    // (for this data exactly; a different one would need the 1-ulp f64 difference to cross
    // an f32 rounding boundary).
    let mut rng = Rng::new(71);
    let whole = grads(&mut rng, 1.0);
    let mut one = whole.clone();
    let norm1 = clip_grad_norm(&mut one, 0.5).unwrap();
    let mut shards: Vec<Vec<Vec<f32>>> = vec![
        whole[..3].to_vec(),
        whole[3..6].to_vec(),
        whole[6..].to_vec(),
    ];
    let total: f64 = shards.iter().map(|s| grad_sum_squares(s)).sum();
    for s in shards.iter_mut() {
        let n = clip_with_sum_squares(s, total, 0.5).unwrap();
        assert!((n - norm1).abs() <= 1e-12 * norm1);
    }
    let joined: Vec<Vec<f32>> = shards.concat();
    assert_eq!(joined, one);
}

#[test]
fn sum_squares_is_reproducible_and_accurate() {
    // 1e6 elements of 1.0 + tiny: an f32 accumulator would lose the tiny parts; f64 keeps
    // them. Two runs give the same bits.
    let g = vec![1.0f32 + 1.0 / 4096.0; 1_000_000];
    let want = 1e6 * (1.0f64 + 1.0 / 4096.0).powi(2);
    let (a, b) = (grad_sum_squares(&[&g[..]]), grad_sum_squares(&[&g[..]]));
    assert_eq!(a.to_bits(), b.to_bits());
    assert!((a - want).abs() <= 1e-12 * want, "{a} vs {want}");
}

#[test]
fn non_finite_norms_and_bad_max_norm() {
    let mut g = vec![vec![1.0f32, f32::INFINITY]];
    let n = clip_grad_norm(&mut g, 1.0).unwrap();
    assert!(n.is_infinite());
    assert_eq!(g[0][0], 0.0, "inf norm: coefficient 0, as torch");
    let mut g = vec![vec![1.0f32, f32::NAN]];
    assert!(clip_grad_norm(&mut g, 1.0).unwrap().is_nan());
    assert_eq!(
        g[0][0], 1.0,
        "NaN norm: left alone for the caller to skip the step"
    );
    let e = clip_grad_norm(&mut g, -1.0).unwrap_err();
    assert!(
        e.to_string().contains("max_norm must be finite and >= 0"),
        "{e}"
    );
}
