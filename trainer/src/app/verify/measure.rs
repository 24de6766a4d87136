//! The measure `cannon verify` takes of a tensor against its float64 reference: the relative
//! L2 distance and largest difference, with NaN kept so a NaN never passes. Its own module so
//! the checks and the report both use it without using each other.

/// How far a tensor is from its reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Distance {
    /// `||a - r|| / max(||r||, 1e-10)`; infinite when the lengths differ.
    pub rel_l2: f64,
    /// `max |a - r|`.
    pub max_abs: f64,
}

/// `max` that keeps a NaN: `f64::max` returns the other operand, which would turn a NaN
/// weight into a passing `max_abs 0`.
pub fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// The distance of `ours` from the float64 reference `r`. A NaN on either side makes both
/// measures NaN, so the row fails and prints `NaN`.
pub fn distance(ours: &[f32], r: &[f64]) -> Distance {
    let any_nan = ours.iter().any(|x| x.is_nan()) || r.iter().any(|x| x.is_nan());
    if any_nan {
        return Distance {
            rel_l2: f64::NAN,
            max_abs: f64::NAN,
        };
    }
    let (mut num, mut den, mut max_abs) = (0.0f64, 0.0f64, 0.0f64);
    for (&a, &b) in ours.iter().zip(r) {
        let e = a as f64 - b;
        num += e * e;
        den += b * b;
        max_abs = nan_max(max_abs, e.abs());
    }
    let mut rel_l2 = num.sqrt() / den.sqrt().max(1e-10);
    if ours.len() != r.len() {
        rel_l2 = f64::INFINITY;
    } else if !rel_l2.is_finite() {
        // inf - inf on matching infinities is NaN: a NaN difference, reported as such.
        rel_l2 = nan_max(rel_l2, f64::INFINITY);
    }
    Distance { rel_l2, max_abs }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_of_equal_and_close_tensors() {
        let d = distance(&[1.0, -2.0], &[1.0, -2.0]);
        assert_eq!((d.rel_l2, d.max_abs), (0.0, 0.0));
        let d = distance(&[3.0, 4.5], &[3.0, 4.0]);
        assert!((d.rel_l2 - 0.1).abs() < 1e-12, "{d:?}");
        assert_eq!(d.max_abs, 0.5);
    }

    #[test]
    fn nan_anywhere_is_nan_in_both_measures() {
        for (ours, r) in [
            (vec![f32::NAN, 1.0], vec![0.0, 1.0]),
            (vec![1.0, f32::NAN], vec![1.0, 1.0]),
            (vec![1.0, 1.0], vec![1.0, f64::NAN]),
            // Matching infinities differ by NaN.
            (vec![f32::INFINITY], vec![f64::INFINITY]),
        ] {
            let d = distance(&ours, &r);
            assert!(
                d.rel_l2.is_nan() && d.max_abs.is_nan(),
                "{ours:?} {r:?}: {d:?}"
            );
        }
        // f64::max alone would forget the NaN.
        assert!(nan_max(f64::NAN, 0.0).is_nan() && nan_max(0.0, f64::NAN).is_nan());
    }

    #[test]
    fn length_mismatch_is_infinite() {
        let d = distance(&[1.0], &[1.0, 2.0]);
        assert_eq!(d.rel_l2, f64::INFINITY);
    }
}
