use super::host::{rope_backward, rope_forward};
use super::*;
use crate::cast::check::{assert_close, dot64, fd_grad, randn, tolerances, wide};
use crate::testutil::{max_abs, rel_l2, Rng};
use half::bf16;

/// Text angles straight from the formula in f64: pos * theta^(-2i/D), i in 0..D/2.
fn text_angles(pos: u32, d: usize, theta: f64) -> Vec<f64> {
    (0..d / 2)
        .map(|i| pos as f64 * theta.powf(-(2.0 * i as f64) / d as f64))
        .collect()
}

/// Pixtral angles from mistral3-facts §1.3 item 4, computed independently: the first D/4 are
/// h * theta^(-4j/D), the last D/4 are w * theta^(-(4j+2)/D), j in 0..D/4.
fn axial_angles(h: usize, w: usize, d: usize, theta: f64) -> Vec<f64> {
    let q = d / 4;
    let rows = (0..q).map(|j| h as f64 * theta.powf(-(4.0 * j as f64) / d as f64));
    let cols = (0..q).map(|j| w as f64 * theta.powf(-(4.0 * j as f64 + 2.0) / d as f64));
    rows.chain(cols).collect()
}

/// transformers' formulation in f64: emb = concat(angles, angles),
/// out = x * cos(emb) + rotate_half(x) * sin(emb), rotate_half(x) = concat(-x2, x1).
fn apply_ref(x: &[f64], angles: &[f64]) -> Vec<f64> {
    let d = x.len();
    let half = d / 2;
    let emb: Vec<f64> = angles.iter().chain(angles).copied().collect();
    let rot: Vec<f64> = (0..d)
        .map(|i| if i < half { -x[i + half] } else { x[i - half] })
        .collect();
    (0..d)
        .map(|i| x[i] * emb[i].cos() + rot[i] * emb[i].sin())
        .collect()
}

/// Backward by the transpose of the explicit D x D matrix of the map above (its columns are
/// the images of the basis vectors): a different algorithm from the kernel's inverse rotation.
fn backward_ref(g: &[f64], angles: &[f64]) -> Vec<f64> {
    let d = g.len();
    let mut out = vec![0.0; d];
    for j in 0..d {
        let mut e = vec![0.0; d];
        e[j] = 1.0;
        let col = apply_ref(&e, angles);
        out[j] = dot64(&col, g);
    }
    out
}

/// Per-token references over [T, H, D].
fn per_head(
    x: &[f64],
    h: usize,
    d: usize,
    angles: &[Vec<f64>],
    f: fn(&[f64], &[f64]) -> Vec<f64>,
) -> Vec<f64> {
    x.chunks(d)
        .enumerate()
        .flat_map(|(i, xh)| f(xh, &angles[i / h]))
        .collect()
}

#[test]
fn text_table_matches_formula() {
    // Positions below 64 keep the f32 angle within 64 * 2^-24 of exact, so cos/sin agree with
    // the f64 formula to ~4e-6; the whole table is checked entry by entry.
    let (d, theta) = (34, 10_000.0);
    let t = RopeTable::text(d, theta, 64).unwrap();
    assert_eq!((t.slots(), t.head_dim()), (64, d));
    let mut worst: f64 = 0.0;
    for p in 0..64 {
        let a = text_angles(p, d, theta);
        let c: Vec<f64> = a.iter().map(|v| v.cos()).collect();
        let s: Vec<f64> = a.iter().map(|v| v.sin()).collect();
        worst = worst
            .max(max_abs(t.cos(p as usize).unwrap(), &c))
            .max(max_abs(t.sin(p as usize).unwrap(), &s));
    }
    assert!(worst < 5e-6, "max |table - formula| = {worst:e}");
}

#[test]
fn text_table_forms_angles_in_f32_like_transformers() {
    // At position 100000 with theta 1e9 (the Mistral text config), the f32 angle differs
    // from the exact one by up to ~4e-3 rad; the table must use the f32 product
    // f32(pos) * f32(inv_freq) (what the model was trained with), not the exact angle.
    let (d, theta) = (128, 1e9);
    let t = RopeTable::text(d, theta, 100_001).unwrap();
    let p = 100_000usize;
    for i in 0..d / 2 {
        let f = (1.0 / theta.powf((2 * i) as f32 as f64 / d as f64)) as f32;
        let a = (p as f32 * f) as f64;
        assert!(
            (t.cos(p).unwrap()[i] as f64 - a.cos()).abs() < 1e-7,
            "i={i}"
        );
        assert!(
            (t.sin(p).unwrap()[i] as f64 - a.sin()).abs() < 1e-7,
            "i={i}"
        );
    }
}

#[test]
fn axial_table_matches_pixtral_formula() {
    // Pixtral: D = 64, theta = 1e4, 110 x 110 patches per side. Angles reach 109 rad, whose
    // f32 rounding is below 109 * 2^-24 = 6.5e-6 (plus the f32 frequency): within 1e-5.
    let (d, theta, side) = (64, 10_000.0, 110);
    let t = RopeTable::axial(d, theta, side, side).unwrap();
    assert_eq!(t.slots(), side * side);
    let mut worst: f64 = 0.0;
    for h in 0..side {
        for w in 0..side {
            let slot = t.axial_slot(h, w).unwrap() as usize;
            assert_eq!(slot, h * side + w);
            let a = axial_angles(h, w, d, theta);
            let c: Vec<f64> = a.iter().map(|v| v.cos()).collect();
            let s: Vec<f64> = a.iter().map(|v| v.sin()).collect();
            worst = worst
                .max(max_abs(t.cos(slot).unwrap(), &c))
                .max(max_abs(t.sin(slot).unwrap(), &s));
        }
    }
    assert!(worst < 1e-5, "max |table - formula| = {worst:e}");
    // A non-square grid and a non-Pixtral head_dim (multiple of 4, not of 16).
    let t = RopeTable::axial(12, theta, 3, 5).unwrap();
    let slot = t.axial_slot(2, 4).unwrap() as usize;
    let a = axial_angles(2, 4, 12, theta);
    assert!(
        max_abs(
            t.cos(slot).unwrap(),
            &a.iter().map(|v| v.cos()).collect::<Vec<_>>()
        ) < 1e-6
    );
    assert!(t.axial_slot(3, 0).is_err() && t.axial_slot(0, 5).is_err());
}

/// Packed text positions (restarting at 0 per sequence) for T tokens.
fn packed_positions(t: usize) -> Vec<u32> {
    let mut pos = Vec::new();
    let mut len = 1;
    while pos.len() < t {
        pos.extend((0..len).take(t - pos.len()));
        len = len * 2 + 1;
    }
    pos
}

fn check_apply<E: Float>() {
    let (tol_f, tol_b) = tolerances::<E>();
    let mut rng = Rng::new(50);
    let theta = 10_000.0;
    // (T, H, D): size 1, head_dim 2, odd numbers of pairs, off the vector width, GQA-like k.
    for &(t, h, d) in &[
        (1usize, 1usize, 2usize),
        (5, 3, 6),
        (9, 2, 34),
        (40, 4, 64),
        (17, 1, 130),
    ] {
        let table = RopeTable::text(d, theta, 64).unwrap();
        let pos = packed_positions(t);
        let angles: Vec<Vec<f64>> = pos.iter().map(|&p| text_angles(p, d, theta)).collect();
        let x0 = randn::<E>(&mut rng, t * h * d, 1.0);
        let mut x = x0.clone();
        rope_forward(&mut x, h, &table, &pos).unwrap();
        let case = format!("{} text T={t} H={h} D={d}", E::NAME);
        assert_close(
            &format!("{case} fwd"),
            &x,
            &per_head(&wide(&x0), h, d, &angles, apply_ref),
            tol_f,
        );

        let g0 = randn::<E>(&mut rng, t * h * d, 1.0);
        let mut g = g0.clone();
        rope_backward(&mut g, h, &table, &pos).unwrap();
        let want = per_head(&wide(&g0), h, d, &angles, backward_ref);
        assert_close(&format!("{case} bwd"), &g, &want, tol_b);
    }
    // Axial: (H, D) on a few patch grids, positions (row, col) of a 3 x 4 image then 2 x 2.
    for &(h, d) in &[(1usize, 4usize), (2, 12), (3, 64)] {
        let table = RopeTable::axial(d, theta, 5, 5).unwrap();
        let mut rc = Vec::new();
        for (rows, cols) in [(3, 4), (2, 2)] {
            for r in 0..rows {
                for c in 0..cols {
                    rc.push((r, c));
                }
            }
        }
        let pos: Vec<u32> = rc
            .iter()
            .map(|&(r, c)| table.axial_slot(r, c).unwrap())
            .collect();
        let angles: Vec<Vec<f64>> = rc
            .iter()
            .map(|&(r, c)| axial_angles(r, c, d, theta))
            .collect();
        let t = pos.len();
        let x0 = randn::<E>(&mut rng, t * h * d, 1.0);
        let mut x = x0.clone();
        rope_forward(&mut x, h, &table, &pos).unwrap();
        let case = format!("{} axial H={h} D={d}", E::NAME);
        assert_close(
            &format!("{case} fwd"),
            &x,
            &per_head(&wide(&x0), h, d, &angles, apply_ref),
            tol_f,
        );
        let mut g = x0.clone();
        rope_backward(&mut g, h, &table, &pos).unwrap();
        let want = per_head(&wide(&x0), h, d, &angles, backward_ref);
        assert_close(&format!("{case} bwd"), &g, &want, tol_b);
    }
}

#[test]
fn f32_matches_f64_reference() {
    check_apply::<f32>();
}

#[test]
fn bf16_matches_f64_reference() {
    check_apply::<bf16>();
}

#[test]
fn backward_inverts_forward_and_matches_finite_differences() {
    let mut rng = Rng::new(51);
    let (t, h, d) = (3, 2, 6);
    let table = RopeTable::text(d, 100.0, 8).unwrap();
    let pos = [0u32, 5, 2];
    let x0 = rng.normal_vec(t * h * d, 1.0);
    let mut x = x0.clone();
    rope_forward(&mut x, h, &table, &pos).unwrap();
    rope_backward(&mut x, h, &table, &pos).unwrap();
    assert!(rel_l2(&x, &x0) < 1e-6, "R^T R x != x: {}", rel_l2(&x, &x0));

    // FD of L = <dy, rope(x)> (f64 reference forward) against the kernel's backward.
    let angles: Vec<Vec<f64>> = pos.iter().map(|&p| text_angles(p, d, 100.0)).collect();
    let dy = rng.normal_vec(t * h * d, 1.0);
    let fd = fd_grad(&wide(&x0), 1e-5, |x| {
        dot64(&wide(&dy), &per_head(x, h, d, &angles, apply_ref))
    });
    let mut g = dy.clone();
    rope_backward(&mut g, h, &table, &pos).unwrap();
    assert_close("kernel backward vs FD", &g, &fd, 1e-4);
}

#[test]
fn errors_name_the_problem() {
    assert!(RopeTable::text(7, 1e4, 4)
        .unwrap_err()
        .to_string()
        .contains("head_dim 7"));
    assert!(RopeTable::axial(6, 1e4, 2, 2)
        .unwrap_err()
        .to_string()
        .contains("multiple of 4"));
    assert!(RopeTable::text(8, 0.0, 4).is_err());
    let table = RopeTable::text(4, 1e4, 4).unwrap();
    assert!(table.axial_slot(0, 0).is_err());
    assert!(table.cos(4).is_none() && table.sin(4).is_none() && table.cos(3).is_some());
    let mut x = vec![0.0f32; 2 * 3 * 4];
    let e = rope_forward(&mut x, 3, &table, &[1, 4]).unwrap_err();
    assert!(
        e.to_string()
            .contains("position 4 of token 1 is outside the table's 4 slots"),
        "{e}"
    );
    let e = rope_backward(&mut x, 2, &table, &[1, 2]).unwrap_err();
    assert!(e.to_string().contains("expected T=2 x H=2 x D=4"), "{e}");
}
