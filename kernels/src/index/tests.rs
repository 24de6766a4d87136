use super::host::{gather_rows, scatter_add_rows, scatter_rows, transpose, zero_rows};
use super::*;
use crate::testutil::Rng;
use cannon_runtime::{DeviceBuffer, Stream};
use half::bf16;

fn rows(r: usize, d: usize, seed: u64) -> Vec<f32> {
    Rng::new(seed).normal_vec(r * d, 1.0)
}

/// A permutation of 0..n followed by a few repeats, from a fixed seed.
fn indices(n: usize, k: usize, seed: u64) -> Vec<usize> {
    let mut rng = Rng::new(seed);
    (0..k).map(|_| rng.below(n)).collect()
}

#[test]
fn gather_and_scatter_match_a_naive_loop() {
    let (r, d) = (37, 5);
    let src = rows(r, d, 1);
    for k in [0, 1, 20, 300] {
        let idx = indices(r, k, k as u64);
        let mut out = vec![0.0; k * d];
        gather_rows(&mut out, &src, &idx, d).unwrap();
        for (i, &j) in idx.iter().enumerate() {
            assert_eq!(out[i * d..(i + 1) * d], src[j * d..(j + 1) * d]);
        }

        // scatter: the last write of a repeated row wins; scatter_add sums in f64-exact
        // order (f32 adds in index order, as a naive loop).
        let vals = rows(k, d, 7);
        let mut dst = rows(r, d, 3);
        let (mut want, mut want_add) = (dst.clone(), dst.clone());
        for (i, &j) in idx.iter().enumerate() {
            for c in 0..d {
                want[j * d + c] = vals[i * d + c];
                want_add[j * d + c] += vals[i * d + c];
            }
        }
        let mut add = dst.clone();
        scatter_rows(&mut dst, &vals, &idx, d).unwrap();
        assert_eq!(dst, want);
        scatter_add_rows(&mut add, &vals, &idx, d).unwrap();
        assert_eq!(add, want_add);

        let mut z = rows(r, d, 4);
        let mut want_z = z.clone();
        for &j in &idx {
            want_z[j * d..(j + 1) * d].fill(0.0);
        }
        zero_rows(&mut z, &idx, d).unwrap();
        assert_eq!(z, want_z);
    }
}

#[test]
fn scatter_add_rounds_bf16_once_per_add() {
    let d = 3;
    let src: Vec<bf16> = rows(4, d, 5).into_iter().map(bf16::from_f32).collect();
    let mut dst = vec![bf16::from_f32(1.0); 2 * d];
    let idx = [1, 0, 1, 1];
    let mut want = dst.clone();
    for (i, &j) in idx.iter().enumerate() {
        for c in 0..d {
            let s = want[j * d + c].to_f32() + src[i * d + c].to_f32();
            want[j * d + c] = bf16::from_f32(s);
        }
    }
    scatter_add_rows(&mut dst, &src, &idx, d).unwrap();
    assert_eq!(dst, want);
}

#[test]
fn transpose_matches_a_naive_loop() {
    for (b, r, c) in [(0, 3, 4), (1, 1, 1), (3, 4, 7), (5, 16, 33)] {
        let x = rows(b * r, c, 9);
        let mut out = vec![0.0; x.len()];
        let dims = TransposeDims {
            batch: b,
            rows: r,
            cols: c,
        };
        transpose(&mut out, &x, dims).unwrap();
        for bi in 0..b {
            for ri in 0..r {
                for ci in 0..c {
                    assert_eq!(out[(bi * c + ci) * r + ri], x[(bi * r + ri) * c + ci]);
                }
            }
        }
        // Transposing back is the identity.
        let mut back = vec![0.0; x.len()];
        let inv = TransposeDims {
            batch: b,
            rows: c,
            cols: r,
        };
        transpose(&mut back, &out, inv).unwrap();
        assert_eq!(back, x);
    }
}

#[test]
fn bad_indices_and_shapes_are_typed_errors() {
    let src = vec![0.0f32; 12];
    let mut out = vec![0.0f32; 4];
    let e = gather_rows(&mut out, &src, &[0, 3, 1], 2).unwrap_err();
    assert!(matches!(e, KernelError::Shape { .. }), "{e}");
    let e = gather_rows(&mut out, &src, &[0, 6], 2).unwrap_err();
    assert!(matches!(e, KernelError::InvalidArgument { .. }), "{e}");
    let e = gather_rows(&mut out, &src, &[0, 1], 5).unwrap_err();
    assert!(matches!(e, KernelError::Shape { .. }), "{e}");
    let e = gather_rows(&mut out, &src, &[0, 1], 0).unwrap_err();
    assert!(matches!(e, KernelError::Shape { .. }), "{e}");
    let mut dst = vec![0.0f32; 6];
    assert!(scatter_rows(&mut dst, &src[..4], &[0, 3], 2).is_err());
    assert!(scatter_add_rows(&mut dst, &src[..4], &[0, 1, 2], 2).is_err());
    assert!(zero_rows(&mut dst, &[3], 2).is_err());
    let d = TransposeDims {
        batch: 2,
        rows: 2,
        cols: 2,
    };
    assert!(transpose(&mut dst, &src[..8], d).is_err());
}

#[test]
fn device_level_matches_slice_level() {
    let s = Stream::cpu();
    let (r, d) = (9, 4);
    let x = rows(r, d, 11);
    let idx = vec![8, 0, 3, 3, 5];
    let xb = DeviceBuffer::clone_htod(&s, &x).unwrap();
    let mut out = DeviceBuffer::<f32>::alloc(&s, idx.len() * d).unwrap();
    crate::ops::gather_rows(&s, &mut out.view_mut(), &xb.view(), &idx, d).unwrap();
    let mut want = vec![0.0; idx.len() * d];
    gather_rows(&mut want, &x, &idx, d).unwrap();
    assert_eq!(out.clone_dtoh(&s).unwrap(), want);

    let mut dst = DeviceBuffer::<f32>::alloc_zeros(&s, r * d).unwrap();
    crate::ops::scatter_add_rows(&s, &mut dst.view_mut(), &out.view(), &idx, d).unwrap();
    let mut want_add = vec![0.0; r * d];
    scatter_add_rows(&mut want_add, &want, &idx, d).unwrap();
    assert_eq!(dst.clone_dtoh(&s).unwrap(), want_add);
    crate::ops::scatter_rows(&s, &mut dst.view_mut(), &out.view(), &idx, d).unwrap();
    scatter_rows(&mut want_add, &want, &idx, d).unwrap();
    assert_eq!(dst.clone_dtoh(&s).unwrap(), want_add);
    crate::ops::zero_rows(&s, &mut dst.view_mut(), &idx, d).unwrap();
    zero_rows(&mut want_add, &idx, d).unwrap();
    assert_eq!(dst.clone_dtoh(&s).unwrap(), want_add);

    let dims = TransposeDims {
        batch: 3,
        rows: 3,
        cols: 4,
    };
    let mut t = DeviceBuffer::<f32>::alloc(&s, 36).unwrap();
    crate::ops::transpose(&s, &mut t.view_mut(), &xb.view(), dims).unwrap();
    let mut want_t = vec![0.0; 36];
    transpose(&mut want_t, &x, dims).unwrap();
    assert_eq!(t.clone_dtoh(&s).unwrap(), want_t);
}
