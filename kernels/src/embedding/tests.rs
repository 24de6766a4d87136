use super::host::{embedding_backward, embedding_forward};
use super::*;
use crate::cast::check::{assert_close, randn, wide};
use crate::testutil::Rng;
use half::bf16;

/// (T, V, D): size 1, odd widths around the vector width, more tokens than rows (repeats).
const SHAPES: [(usize, usize, usize); 5] = [
    (1, 1, 1),
    (7, 3, 17),
    (64, 10, 33),
    (300, 1000, 5),
    (50, 2, 130),
];

fn check<E: Float>() {
    let mut rng = Rng::new(60);
    for &(t, v, d) in &SHAPES {
        let w = randn::<E>(&mut rng, v * d, 1.0);
        let ids: Vec<u32> = (0..t).map(|_| rng.below(v) as u32).collect();
        let mut out = vec![E::default(); t * d];
        embedding_forward(&mut out, &ids, &w, d).unwrap();
        // Forward is a copy: exact.
        for (i, &id) in ids.iter().enumerate() {
            let (o, r) = (wide(&out[i * d..][..d]), wide(&w[id as usize * d..][..d]));
            assert_eq!(o, r, "T={t} V={v} D={d} token {i}");
        }
        // Backward: naive f64 scatter (token by token, element by element) onto a non-zero
        // start, since it accumulates. f32 sums of a few terms: 1e-6 relative at most.
        let dout = randn::<E>(&mut rng, t * d, 1.0);
        let dw0 = rng.normal_vec(v * d, 1.0);
        let mut want: Vec<f64> = dw0.iter().map(|&x| x as f64).collect();
        for (i, &id) in ids.iter().enumerate() {
            for j in 0..d {
                want[id as usize * d + j] += dout[i * d + j].to_f32() as f64;
            }
        }
        let mut dw = dw0.clone();
        embedding_backward(&mut dw, &dout, &ids, d).unwrap();
        assert_close(
            &format!("{} T={t} V={v} D={d} dW", E::NAME),
            &dw,
            &want,
            1e-6,
        );
    }
}

#[test]
fn f32_matches_reference() {
    check::<f32>();
}

#[test]
fn bf16_matches_reference() {
    check::<bf16>();
}

#[test]
fn backward_is_deterministic_and_sums_in_token_order() {
    // Many tokens on one id: the result is the left-to-right f32 sum, bit for bit.
    let d = 19;
    let dout = Rng::new(61).normal_vec(200 * d, 1.0);
    let ids: Vec<u32> = (0..200).map(|t| if t % 3 == 0 { 1 } else { 0 }).collect();
    let mut dw = vec![0.0f32; 2 * d];
    embedding_backward(&mut dw, &dout, &ids, d).unwrap();
    for v in 0..2u32 {
        for j in 0..d {
            let mut s = 0.0f32;
            for (t, &id) in ids.iter().enumerate() {
                if id == v {
                    s += dout[t * d + j];
                }
            }
            assert_eq!(dw[v as usize * d + j].to_bits(), s.to_bits());
        }
    }
}

#[test]
fn out_of_range_ids_are_errors() {
    let w = vec![0.0f32; 4 * 3];
    let mut out = vec![0.0f32; 2 * 3];
    let e = embedding_forward(&mut out, &[3, 4], &w, 3).unwrap_err();
    assert!(
        e.to_string()
            .contains("token 1 has id 4, outside the vocabulary of 4"),
        "{e}"
    );
    let mut dw = vec![0.0f32; 12];
    let e = embedding_backward(&mut dw, &out, &[7, 0], 3).unwrap_err();
    assert!(e.to_string().contains("token 0 has id 7"), "{e}");
    assert!(dw.iter().all(|&x| x == 0.0), "nothing is written on error");
    let e = embedding_forward(&mut out, &[0], &w, 3).unwrap_err();
    assert!(
        e.to_string().contains("out has 6 elements, expected 3"),
        "{e}"
    );
}

#[test]
fn gradient_matches_finite_differences() {
    // L(W) = <dout, gather(W, ids)> in f64, differentiated numerically w.r.t. every W entry.
    let (v, d) = (4, 3);
    let ids = [2u32, 0, 2, 3, 2];
    let mut rng = Rng::new(62);
    let w: Vec<f64> = (0..v * d).map(|_| rng.normal()).collect();
    let dout: Vec<f64> = (0..ids.len() * d).map(|_| rng.normal()).collect();
    let loss = |w: &[f64]| -> f64 {
        let gathered: Vec<f64> = ids
            .iter()
            .flat_map(|&i| w[i as usize * d..][..d].to_vec())
            .collect();
        crate::cast::check::dot64(&dout, &gathered)
    };
    let fd = crate::cast::check::fd_grad(&w, 1e-5, loss);
    let mut dw = vec![0.0f32; v * d];
    let dout32: Vec<f32> = dout.iter().map(|&x| x as f32).collect();
    embedding_backward(&mut dw, &dout32, &ids, d).unwrap();
    assert_close("dW vs FD", &dw, &fd, 1e-4);
}
