use super::host::{add_into, mul, mul_into};
use super::*;
use crate::testutil::Rng;
use cannon_runtime::{DeviceBuffer, Stream};
use half::bf16;

/// Sizes: empty, 1, odd, and more than one rayon chunk.
const SIZES: [usize; 5] = [0, 1, 17, 4099, 70_001];

fn data(n: usize, seed: u64) -> Vec<f32> {
    Rng::new(seed).normal_vec(n, 2.0)
}

/// Naive float64 reference of `op` rounded to E once, as the kernels promise.
fn check<E: Float>(op: fn(f64, f64) -> f64, run: fn(&mut [E], &[E], &[E])) {
    for n in SIZES {
        let a: Vec<E> = data(n, 1).into_iter().map(E::from_f32).collect();
        let b: Vec<E> = data(n, 2).into_iter().map(E::from_f32).collect();
        let mut out = vec![E::default(); n];
        run(&mut out, &a, &b);
        for i in 0..n {
            // f32 arithmetic on f32 (or bf16-exact) inputs: the f64 result rounded to f32,
            // then to E, is what one correctly rounded f32 operation gives.
            let want = E::from_f32(op(a[i].to_f32() as f64, b[i].to_f32() as f64) as f32);
            assert_eq!(
                out[i].to_f32().to_bits(),
                want.to_f32().to_bits(),
                "{} {n} {i}",
                E::NAME
            );
        }
    }
}

fn add_run<E: Float>(out: &mut [E], a: &[E], b: &[E]) {
    out.copy_from_slice(a);
    add_into(out, b).unwrap();
}

fn mul_into_run<E: Float>(out: &mut [E], a: &[E], b: &[E]) {
    out.copy_from_slice(a);
    mul_into(out, b).unwrap();
}

fn mul_run<E: Float>(out: &mut [E], a: &[E], b: &[E]) {
    mul(out, a, b).unwrap();
}

#[test]
fn add_into_is_the_rounded_sum() {
    check::<f32>(|a, b| a + b, add_run);
    check::<bf16>(|a, b| a + b, add_run);
}

#[test]
fn products_are_the_rounded_product() {
    check::<f32>(|a, b| a * b, mul_run);
    check::<bf16>(|a, b| a * b, mul_run);
    check::<f32>(|a, b| a * b, mul_into_run);
    check::<bf16>(|a, b| a * b, mul_into_run);
}

#[test]
fn length_mismatch_is_a_shape_error() {
    let mut y = vec![0.0f32; 3];
    assert!(add_into(&mut y, &[1.0; 4]).is_err());
    assert!(mul_into(&mut y, &[1.0; 2]).is_err());
    assert!(mul(&mut y, &[1.0; 3], &[1.0; 2]).is_err());
    assert!(mul(&mut [0.0; 2], &[1.0; 3], &[1.0; 3]).is_err());
}

#[test]
fn device_level_matches_slice_level() {
    let s = Stream::cpu();
    let (a, b) = (data(1000, 3), data(1000, 4));
    let mut y = DeviceBuffer::clone_htod(&s, &a).unwrap();
    let x = DeviceBuffer::clone_htod(&s, &b).unwrap();
    crate::ops::add_into(&s, &mut y.view_mut(), &x.view()).unwrap();
    let mut want = a.clone();
    add_into(&mut want, &b).unwrap();
    assert_eq!(y.clone_dtoh(&s).unwrap(), want);

    let mut out = DeviceBuffer::<f32>::alloc(&s, 1000).unwrap();
    let ya = DeviceBuffer::clone_htod(&s, &a).unwrap();
    crate::ops::mul(&s, &mut out.view_mut(), &ya.view(), &x.view()).unwrap();
    mul(&mut want, &a, &b).unwrap();
    assert_eq!(out.clone_dtoh(&s).unwrap(), want);
    crate::ops::mul_into(&s, &mut out.view_mut(), &x.view()).unwrap();
    mul_into(&mut want, &b).unwrap();
    assert_eq!(out.clone_dtoh(&s).unwrap(), want);
}
