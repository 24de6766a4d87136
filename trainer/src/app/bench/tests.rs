use super::*;
use std::path::Path;

fn tiny() -> Mistral3Config {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/reference/mistral3-tiny");
    Mistral3Config::from_file(&p.join("config.json")).unwrap_or_else(|e| {
        panic!(
            "missing {}: the shared fixtures live beside the project ({e})",
            p.display()
        )
    })
}

#[test]
fn batch_has_the_scripts_layout() {
    let cfg = tiny(); // patch 2, merge 2: an 8 px image is 2 x 2 merged patches
    let b = bench_batch(&cfg, 2, 16, 8, 3).unwrap();
    let img = cfg.image_token_index;
    // BOS, [IMG] [IMG] [IMG_BREAK], [IMG] [IMG] [IMG_END], then text.
    assert_eq!(
        &b.input_ids[..7],
        &[1, img, img, IMG_BREAK, img, img, IMG_END]
    );
    for row in 0..2 {
        let (ids, labels) = (&b.input_ids[row * 16..][..16], &b.labels[row * 16..][..16]);
        assert!(labels[..7].iter().all(|&l| l == IGNORE_INDEX));
        for (&t, &l) in ids[7..].iter().zip(&labels[7..]) {
            assert!((16..384).contains(&t));
            assert_eq!(l, t as i32);
        }
    }
    assert_eq!(b.images.sizes, vec![(8, 8); 2]);
    assert_eq!(b.images.pixel_values.len(), 2 * 3 * 8 * 8);
    b.check().unwrap();
}

#[test]
fn shapes_that_cannot_hold_the_image_are_errors() {
    let cfg = tiny();
    let e = bench_batch(&cfg, 1, 16, 6, 0).unwrap_err().to_string();
    assert!(e.contains("--img 6") && e.contains("= 4"), "{e}");
    let e = bench_batch(&cfg, 1, 7, 8, 0).unwrap_err().to_string();
    assert!(e.contains("--seq 7"), "{e}");
    let b = StepBench {
        steps: 0,
        ..StepBench::default()
    };
    assert!(run(&cfg, &b).unwrap_err().to_string().contains("--steps"));
}

#[test]
fn steps_train_and_report() {
    let cfg = tiny();
    for precision in [Precision::F32, Precision::Bf16] {
        let b = StepBench {
            batch: 2,
            seq: 32,
            img: 8,
            steps: 3,
            warmup: 1,
            precision,
            seed: 1,
        };
        let r = run(&cfg, &b).unwrap();
        // Random weights of +-0.02: the first loss is close to ln V.
        assert!(
            (r.loss - (384f64).ln()).abs() < 0.5,
            "{precision}: {}",
            r.loss
        );
        assert!(r.min_step_s > 0.0 && r.min_step_s <= r.median_step_s);
        let text: usize = ParamLayoutSizes::text(&cfg);
        assert_eq!(r.trainable_params, text);
        assert!(r.max_allocated_mib > 0.0 && r.max_reserved_mib >= r.max_allocated_mib);
        // The warm-up step put every shape of the step in the allocator's cache: timed steps
        // must not take new blocks from the host (each one is zeroed and page-faulted in).
        assert_eq!(r.device_allocs_per_step, 0.0, "{precision}");
        // The floor is the step's model FLOPs at the peak measured in the run.
        assert!(r.model_flops > 0.0 && r.gemm_peak_flops > 0.0);
        let floor = r.model_flops / r.gemm_peak_flops;
        assert!((r.floor_s() - floor).abs() <= 1e-12 * floor);
        assert!((r.mfu() - floor / r.median_step_s).abs() <= 1e-9 * r.mfu());
        // Each step against the GEMM peak probed beside it: no better than the run's best, so
        // each ratio is at most that step's time over the best-peak floor, and so is their
        // median against the median step.
        let over = r.step_over_floor.expect("single runs probe between steps");
        assert!(
            over > 0.0 && over <= r.median_step_s / floor * (1.0 + 1e-12),
            "{over}"
        );
        let json = r.to_json();
        for key in [
            "median_step_s",
            "tokens_per_s",
            "trainable_params",
            "max_allocated_mib",
            "mfu",
            "floor_s",
            "step_over_floor",
            "gemm_peak_gflops",
        ] {
            assert!(json.contains(key), "{json}");
        }
    }
}

/// The text parameters counted from the config, independently of the layout code.
struct ParamLayoutSizes;

impl ParamLayoutSizes {
    fn text(cfg: &Mistral3Config) -> usize {
        let t = &cfg.text_config;
        let (d, v, i) = (t.hidden_size, t.vocab_size, t.intermediate_size);
        let hd = t.head_dim.unwrap_or(d / t.num_attention_heads);
        let (q, kv) = (t.num_attention_heads * hd, t.num_key_value_heads * hd);
        let layer = 2 * d + d * q + 2 * d * kv + q * d + 3 * d * i;
        v * d + t.num_hidden_layers * layer + d + v * d
    }
}
