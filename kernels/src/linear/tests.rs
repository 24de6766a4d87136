//! linear against a float64 implementation written out element by element, central finite
//! differences of that float64 forward for the gradient formulas, and the bf16 paths against
//! both.

use super::host::{linear_backward, linear_forward};
use super::*;
use crate::error::KernelError;
use crate::gemm::Precision;
use crate::testutil::{rel_l2, Rng};
use half::bf16;

/// Float64 forward, element by element: `y[t][o] = sum_i x[t][i] w[o][i] + b[o]`.
fn forward_f64(x: &[f64], w: &[f64], b: Option<&[f64]>, d: LinearDims) -> Vec<f64> {
    let mut y = vec![0.0; d.t * d.d_out];
    for t in 0..d.t {
        for o in 0..d.d_out {
            let mut s = b.map_or(0.0, |b| b[o]);
            for i in 0..d.d_in {
                s += x[t * d.d_in + i] * w[o * d.d_in + i];
            }
            y[t * d.d_out + o] = s;
        }
    }
    y
}

/// Float64 gradients of `L = sum(dy * y)` by the formulas the kernel uses (dX = dY W,
/// dW = dY^T X, db = sum_t dY), added to the given starting values.
struct Grads64 {
    dx: Vec<f64>,
    dw: Vec<f64>,
    db: Vec<f64>,
}

fn backward_f64(dy: &[f64], x: &[f64], w: &[f64], d: LinearDims, start: &Grads64) -> Grads64 {
    let (mut dx, mut dw, mut db) = (start.dx.clone(), start.dw.clone(), start.db.clone());
    for t in 0..d.t {
        for o in 0..d.d_out {
            let g = dy[t * d.d_out + o];
            db[o] += g;
            for i in 0..d.d_in {
                dx[t * d.d_in + i] += g * w[o * d.d_in + i];
                dw[o * d.d_in + i] += g * x[t * d.d_in + i];
            }
        }
    }
    Grads64 { dx, dw, db }
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn dims_list() -> Vec<LinearDims> {
    let d = |t, d_in, d_out| LinearDims { t, d_in, d_out };
    vec![
        d(1, 1, 1),
        d(3, 5, 7),
        d(17, 33, 65),
        d(64, 48, 20),
        d(31, 129, 47),
        d(100, 16, 1),
    ]
}

struct Data {
    x: Vec<f32>,
    w: Vec<f32>,
    b: Vec<f32>,
    dy: Vec<f32>,
    dx0: Vec<f32>,
    dw0: Vec<f32>,
    db0: Vec<f32>,
}

fn data(rng: &mut Rng, d: LinearDims) -> Data {
    Data {
        x: rng.normal_vec(d.t * d.d_in, 1.0),
        w: rng.normal_vec(d.d_out * d.d_in, 0.5),
        b: rng.normal_vec(d.d_out, 0.5),
        dy: rng.normal_vec(d.t * d.d_out, 1.0),
        dx0: rng.normal_vec(d.t * d.d_in, 1.0),
        dw0: rng.normal_vec(d.d_out * d.d_in, 1.0),
        db0: rng.normal_vec(d.d_out, 1.0),
    }
}

fn start64(v: &Data) -> Grads64 {
    Grads64 {
        dx: f64s(&v.dx0),
        dw: f64s(&v.dw0),
        db: f64s(&v.db0),
    }
}

// f32 bars (DESIGN.md): forward 1e-5, gradients 1e-4; the products' f32 rounding is ~1e-7.
#[test]
fn f32_forward_and_backward_match_f64() {
    let mut rng = Rng::new(21);
    for d in dims_list() {
        let v = data(&mut rng, d);
        for with_bias in [false, true] {
            let mut y = vec![f32::NAN; d.t * d.d_out];
            let b = with_bias.then_some(v.b.as_slice());
            linear_forward(Precision::F32, &mut y, &v.x, &v.w, b, d).unwrap();
            let b64 = f64s(&v.b);
            let r = forward_f64(&f64s(&v.x), &f64s(&v.w), with_bias.then_some(&b64[..]), d);
            let e = rel_l2(&y, &r);
            assert!(e <= 1e-5, "{d:?} bias {with_bias}: forward rel_l2 {e:e}");
        }
        let (mut dx, mut dw, mut db) = (v.dx0.clone(), v.dw0.clone(), v.db0.clone());
        let g = LinearGrads {
            dx: Some(&mut dx),
            dw: Some(&mut dw),
            db: Some(&mut db),
        };
        linear_backward(Precision::F32, g, &v.dy, &v.x, &v.w, d).unwrap();
        let r = backward_f64(&f64s(&v.dy), &f64s(&v.x), &f64s(&v.w), d, &start64(&v));
        for (name, got, want) in [("dx", &dx, &r.dx), ("dw", &dw, &r.dw), ("db", &db, &r.db)] {
            let e = rel_l2(got, want);
            assert!(e <= 1e-4, "{d:?} {name}: rel_l2 {e:e}");
        }
    }
}

/// The gradient formulas against central differences of the float64 forward of
/// `L = sum(G * Y)`: with h = 1e-6 the truncation error is O(h^2) (exactly 0 for this linear
/// L) and the cancellation error ~1e-16/1e-6 = 1e-10 relative, so 1e-7 is a safe bar.
#[test]
fn gradient_formulas_match_finite_differences() {
    let mut rng = Rng::new(22);
    let d = LinearDims {
        t: 3,
        d_in: 4,
        d_out: 5,
    };
    let v = data(&mut rng, d);
    let (x, w, b, gy) = (f64s(&v.x), f64s(&v.w), f64s(&v.b), f64s(&v.dy));
    let loss = |x: &[f64], w: &[f64], b: &[f64]| -> f64 {
        let y = forward_f64(x, w, Some(b), d);
        y.iter().zip(&gy).map(|(a, g)| a * g).sum()
    };
    let zero = Grads64 {
        dx: vec![0.0; x.len()],
        dw: vec![0.0; w.len()],
        db: vec![0.0; b.len()],
    };
    let an = backward_f64(&gy, &x, &w, d, &zero);
    let h = 1e-6;
    let fd = |which: usize, i: usize| {
        let (mut xp, mut wp, mut bp) = (x.clone(), w.clone(), b.clone());
        let (mut xm, mut wm, mut bm) = (x.clone(), w.clone(), b.clone());
        match which {
            0 => (xp[i] += h, xm[i] -= h),
            1 => (wp[i] += h, wm[i] -= h),
            _ => (bp[i] += h, bm[i] -= h),
        };
        (loss(&xp, &wp, &bp) - loss(&xm, &wm, &bm)) / (2.0 * h)
    };
    for (which, grad) in [(0, &an.dx), (1, &an.dw), (2, &an.db)] {
        let num: Vec<f64> = (0..grad.len()).map(|i| fd(which, i)).collect();
        let e = rel_l2(grad, &num);
        assert!(
            e <= 1e-7,
            "grad {which}: formula vs finite differences rel_l2 {e:e}"
        );
    }
    // And the kernel computes that formula (checked at scale above; here on this tiny shape).
    let (mut dx, mut dw, mut db) = (vec![0.0f32; x.len()], vec![0.0; w.len()], vec![0.0; 5]);
    let g = LinearGrads {
        dx: Some(&mut dx),
        dw: Some(&mut dw),
        db: Some(&mut db),
    };
    linear_backward(Precision::F32, g, &v.dy, &v.x, &v.w, d).unwrap();
    assert!(rel_l2(&dx, &an.dx) <= 1e-6);
    assert!(rel_l2(&dw, &an.dw) <= 1e-6);
    assert!(rel_l2(&db, &an.db) <= 1e-6);
}

/// dW accumulates into a window of a flat buffer and touches nothing outside it; `None`
/// gradients are skipped.
#[test]
fn dw_window_of_flat_buffer_and_optional_grads() {
    let mut rng = Rng::new(23);
    let d = LinearDims {
        t: 9,
        d_in: 12,
        d_out: 10,
    };
    let v = data(&mut rng, d);
    let mut flat = vec![1.5f32; 7 + d.d_out * d.d_in + 5];
    let g = LinearGrads {
        dx: None,
        dw: Some(&mut flat[7..7 + d.d_out * d.d_in]),
        db: None,
    };
    linear_backward(Precision::F32, g, &v.dy, &v.x, &v.w, d).unwrap();
    assert!(flat[..7].iter().chain(&flat[7 + 120..]).all(|&x| x == 1.5));
    let zero = Grads64 {
        dx: vec![0.0; d.t * d.d_in],
        dw: vec![1.5; d.d_out * d.d_in],
        db: vec![0.0; d.d_out],
    };
    let r = backward_f64(&f64s(&v.dy), &f64s(&v.x), &f64s(&v.w), d, &zero);
    assert!(rel_l2(&flat[7..127], &r.dw) <= 1e-5);
    // Nothing requested: a no-op, not an error.
    let none = LinearGrads {
        dx: None,
        dw: None,
        db: None,
    };
    linear_backward(Precision::F32, none, &v.dy, &v.x, &v.w, d).unwrap();
}

fn to_bf16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

fn rounded64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| bf16::from_f32(x).to_f64()).collect()
}

/// bf16 storage: against float64 of the unrounded inputs, the DESIGN.md bars (forward 0.015,
/// gradients 0.04; the expected error is ~2^-9 * sqrt(2) ~ 3e-3); against float64 of the
/// bf16-rounded inputs the kernel itself must be f32-accurate (1e-5). dY is given as f32 (the
/// trainer's f32 activation gradients) and as bf16; both round to the same products.
#[test]
fn bf16_forward_and_backward_match_f64() {
    let mut rng = Rng::new(24);
    for d in dims_list().into_iter().filter(|d| d.t * d.d_out >= 100) {
        let v = data(&mut rng, d);
        let (xh, wh, bh) = (to_bf16(&v.x), to_bf16(&v.w), to_bf16(&v.b));
        let mut y = vec![0.0f32; d.t * d.d_out];
        linear_forward(Precision::Bf16, &mut y, &xh, &wh, Some(&bh), d).unwrap();
        let (rb, fb) = (rounded64(&v.b), f64s(&v.b));
        let exact = forward_f64(&f64s(&v.x), &f64s(&v.w), Some(&fb), d);
        let rounded = forward_f64(&rounded64(&v.x), &rounded64(&v.w), Some(&rb), d);
        let e = rel_l2(&y, &exact);
        assert!(e <= 0.015, "{d:?}: bf16 forward vs exact rel_l2 {e:e}");
        let e = rel_l2(&y, &rounded);
        assert!(
            e <= 1e-5,
            "{d:?}: bf16 forward vs rounded inputs rel_l2 {e:e}"
        );

        // bf16 Y: the f32 Y rounded once.
        let mut yh = vec![bf16::ZERO; y.len()];
        linear_forward(Precision::Bf16, &mut yh, &xh, &wh, Some(&bh), d).unwrap();
        assert!(yh.iter().zip(&y).all(|(a, &b)| *a == bf16::from_f32(b)));

        let exact = backward_f64(&f64s(&v.dy), &f64s(&v.x), &f64s(&v.w), d, &start64(&v));
        let dyh = to_bf16(&v.dy);
        for dy_bf16 in [false, true] {
            let (mut dx, mut dw, mut db) = (v.dx0.clone(), v.dw0.clone(), v.db0.clone());
            let g = LinearGrads {
                dx: Some(&mut dx),
                dw: Some(&mut dw),
                db: Some(&mut db),
            };
            if dy_bf16 {
                linear_backward(Precision::Bf16, g, &dyh, &xh, &wh, d).unwrap();
            } else {
                linear_backward(Precision::Bf16, g, &v.dy, &xh, &wh, d).unwrap();
            }
            for (name, got, want) in [("dx", &dx, &exact.dx), ("dw", &dw, &exact.dw)] {
                let e = rel_l2(got, want);
                assert!(e <= 0.04, "{d:?} dy bf16 {dy_bf16} {name}: rel_l2 {e:e}");
            }
            // db sums dY's own values: exact up to f32 sums when dY is f32.
            let bar = if dy_bf16 { 0.04 } else { 1e-5 };
            let e = rel_l2(&db, &exact.db);
            assert!(e <= bar, "{d:?} dy bf16 {dy_bf16} db: rel_l2 {e:e}");
        }
        // The kernel's own error: against float64 of the rounded operands.
        let rounded = backward_f64(
            &rounded64(&v.dy),
            &rounded64(&v.x),
            &rounded64(&v.w),
            d,
            &start64(&v),
        );
        let (mut dx, mut dw) = (v.dx0.clone(), v.dw0.clone());
        let g = LinearGrads {
            dx: Some(&mut dx),
            dw: Some(&mut dw),
            db: None,
        };
        linear_backward(Precision::Bf16, g, &v.dy, &xh, &wh, d).unwrap();
        assert!(rel_l2(&dx, &rounded.dx) <= 1e-5, "{d:?} dx vs rounded");
        assert!(rel_l2(&dw, &rounded.dw) <= 1e-5, "{d:?} dw vs rounded");
    }
}

/// bf16 Y is computed in tiles (1024 rows x 2048 columns): across tile edges it must still be
/// exactly the f32 Y rounded once.
#[test]
fn bf16_output_tiles_equal_rounded_f32_output() {
    let mut rng = Rng::new(25);
    let d = LinearDims {
        t: 1030,
        d_in: 9,
        d_out: 2050,
    };
    let v = data(&mut rng, d);
    let (xh, wh, bh) = (to_bf16(&v.x), to_bf16(&v.w), to_bf16(&v.b));
    let mut y = vec![0.0f32; d.t * d.d_out];
    linear_forward(Precision::Bf16, &mut y, &xh, &wh, Some(&bh), d).unwrap();
    let mut yh = vec![bf16::ZERO; y.len()];
    linear_forward(Precision::Bf16, &mut yh, &xh, &wh, Some(&bh), d).unwrap();
    assert!(yh.iter().zip(&y).all(|(a, &b)| *a == bf16::from_f32(b)));
}

#[test]
fn bad_lengths_are_shape_errors() {
    let d = LinearDims {
        t: 2,
        d_in: 3,
        d_out: 4,
    };
    let (x, w, mut y) = (vec![0.0f32; 6], vec![0.0f32; 12], vec![0.0f32; 8]);
    assert!(linear_forward(Precision::F32, &mut y, &x, &w, None, d).is_ok());
    let short = linear_forward(Precision::F32, &mut y, &x[..5], &w, None, d);
    assert!(matches!(short, Err(KernelError::Shape { .. })));
    let bias = linear_forward(Precision::F32, &mut y, &x, &w, Some(&[0.0; 3]), d);
    assert!(matches!(bias, Err(KernelError::Shape { .. })));
    let mut dw = vec![0.0f32; 11];
    let g = LinearGrads {
        dx: None,
        dw: Some(&mut dw),
        db: None,
    };
    let r = linear_backward(Precision::F32, g, &y, &x, &w, d);
    assert!(matches!(r, Err(KernelError::Shape { .. })));
    let mut yh = vec![bf16::ZERO; 7];
    let r = linear_forward(Precision::Bf16, &mut yh, &x, &w, None, d);
    assert!(matches!(r, Err(KernelError::Shape { .. })));
}

/// F32 products on a bf16 operand would silently widen it: a typed error naming the operand.
#[test]
fn f32_precision_rejects_bf16_operands() {
    let d = LinearDims {
        t: 2,
        d_in: 3,
        d_out: 4,
    };
    let (x, w) = (vec![bf16::ONE; 6], vec![0.5f32; 12]);
    let mut y = vec![0.0f32; 8];
    let e = linear_forward(Precision::F32, &mut y, &x, &w, None, d).unwrap_err();
    assert!(
        matches!(&e, KernelError::InvalidArgument { op: "linear_forward", detail } if detail.contains("x is bf16")),
        "{e}"
    );
    let mut yh = vec![bf16::ZERO; 8];
    let xf = vec![1.0f32; 6];
    let e = linear_forward(Precision::F32, &mut yh, &xf, &w, None, d).unwrap_err();
    assert!(e.to_string().contains("y is bf16"), "{e}");
    // The same operands under Bf16 products are accepted.
    linear_forward(Precision::Bf16, &mut y, &x, &w, None, d).unwrap();
    assert!(y.iter().all(|&v| v == 1.5), "{y:?}");
}
