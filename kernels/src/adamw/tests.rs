use super::host::adamw_step;
use super::*;
use crate::testutil::{rel_l2, Rng};

/// torch.optim.AdamW (`_single_tensor_adam` with decoupled weight decay) transcribed in f64.
struct Reference {
    p: Vec<f64>,
    m: Vec<f64>,
    v: Vec<f64>,
    step: u64,
}

impl Reference {
    fn step(&mut self, g: &[f32], hp: &AdamW) {
        self.step += 1;
        let t = self.step as i32;
        let bias_correction1 = 1.0 - hp.beta1.powi(t);
        let bias_correction2 = 1.0 - hp.beta2.powi(t);
        let step_size = hp.lr / bias_correction1;
        let bias_correction2_sqrt = bias_correction2.sqrt();
        for i in 0..self.p.len() {
            let g = g[i] as f64;
            self.p[i] *= 1.0 - hp.lr * hp.weight_decay; // param.mul_(1 - lr * weight_decay)
            self.m[i] += (1.0 - hp.beta1) * (g - self.m[i]); // exp_avg.lerp_(grad, 1 - beta1)
            self.v[i] = self.v[i] * hp.beta2 + (1.0 - hp.beta2) * g * g; // mul_.addcmul_
            let denom = self.v[i].sqrt() / bias_correction2_sqrt + hp.eps;
            self.p[i] -= step_size * self.m[i] / denom; // addcdiv_(value=-step_size)
        }
    }
}

#[test]
fn several_steps_match_torch_transcription() {
    // Sizes: 1, odd, off the vector width, several rayon chunks. The comparison is on the
    // *change* of the parameters (p - p0), which is ~lr-sized: comparing p itself would hide
    // update errors behind the parameters' magnitude. f32 steps vs f64: 1e-4 (DESIGN's "K
    // AdamW steps' parameters" bound), applied to the stricter quantity.
    let mut rng = Rng::new(80);
    let schedule = [1e-3, 5e-4, 2e-3, 1e-3, 3e-4, 1e-3, 1e-3];
    for &n in &[1usize, 17, 1000, 100_003] {
        for hp0 in [
            AdamW::default(),
            AdamW {
                lr: 0.0,
                beta1: 0.8,
                beta2: 0.95,
                eps: 1e-6,
                weight_decay: 0.0,
            },
        ] {
            let p0 = rng.normal_vec(n, 1.0);
            let mut p = p0.clone();
            let (mut m, mut v) = (vec![0.0f32; n], vec![0.0f32; n]);
            let mut r = Reference {
                p: p0.iter().map(|&x| x as f64).collect(),
                m: vec![0.0; n],
                v: vec![0.0; n],
                step: 0,
            };
            for (k, &lr) in schedule.iter().enumerate() {
                let hp = AdamW { lr, ..hp0 }; // the learning rate follows a schedule
                                              // Gradients of mixed scales, some tiny (where eps matters).
                let g: Vec<f32> = rng
                    .normal_vec(n, 1.0)
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| x * 10f32.powi(i as i32 % 5 - 3))
                    .collect();
                adamw_step(&mut p, &g, &mut m, &mut v, k as u64 + 1, &hp).unwrap();
                r.step(&g, &hp);
            }
            let dp: Vec<f64> = p
                .iter()
                .zip(&p0)
                .map(|(&a, &b)| a as f64 - b as f64)
                .collect();
            let rdp: Vec<f64> = r.p.iter().zip(&p0).map(|(&a, &b)| a - b as f64).collect();
            let what = format!("N={n} {hp0:?}");
            assert!(
                rel_l2(&dp, &rdp) <= 1e-4,
                "{what}: update rel L2 {}",
                rel_l2(&dp, &rdp)
            );
            assert!(rel_l2(&m, &r.m) <= 1e-5, "{what}: m {}", rel_l2(&m, &r.m));
            assert!(rel_l2(&v, &r.v) <= 1e-5, "{what}: v {}", rel_l2(&v, &r.v));
        }
    }
}

#[test]
fn first_step_is_sign_like_and_decay_is_decoupled() {
    // Step 1 with bias correction: m_hat = g, v_hat = g^2, so the update is -lr * g / (|g| +
    // eps) ~ -lr sign(g), whatever the gradient's scale; weight decay multiplies p by
    // (1 - lr wd) independently of the gradient.
    let hp = AdamW {
        lr: 0.1,
        weight_decay: 0.5,
        ..AdamW::default()
    };
    let mut p = vec![2.0f32, 2.0, 2.0];
    let g = [1e-3f32, -50.0, 0.0];
    let (mut m, mut v) = (vec![0.0; 3], vec![0.0; 3]);
    adamw_step(&mut p, &g, &mut m, &mut v, 1, &hp).unwrap();
    let decayed = 2.0 * (1.0 - 0.1f64 * 0.5) as f32; // f32(1 - lr wd), as torch
    assert!((p[0] - (decayed - 0.1)).abs() < 1e-5, "{p:?}");
    assert!((p[1] - (decayed + 0.1)).abs() < 1e-5, "{p:?}");
    assert_eq!(p[2], decayed, "zero gradient: only the decay");
}

#[test]
fn invalid_arguments_are_errors() {
    let (mut p, mut m, mut v) = (vec![0.0f32; 2], vec![0.0f32; 2], vec![0.0f32; 2]);
    let g = [0.0f32; 2];
    let e = adamw_step(&mut p, &g, &mut m, &mut v, 0, &AdamW::default()).unwrap_err();
    assert!(e.to_string().contains("step is 1-based"), "{e}");
    let hp = AdamW {
        beta2: 1.0,
        ..AdamW::default()
    };
    let e = adamw_step(&mut p, &g, &mut m, &mut v, 1, &hp).unwrap_err();
    assert!(e.to_string().contains("invalid beta2 1"), "{e}");
    let e = adamw_step(&mut p, &g[..1], &mut m, &mut v, 1, &AdamW::default()).unwrap_err();
    assert!(
        e.to_string().contains("grads has 1 elements, expected 2"),
        "{e}"
    );
}
