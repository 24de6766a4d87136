//! The `cannon train` config: defaults, file parsing, `--set` overrides, errors that name the
//! key, the TOML round trip; and the LR schedule against values computed by hand.

use cannon_trainer::model::{Part, Precision};
use cannon_trainer::train::config::{Resume, Schedule, TrainConfig};
use cannon_trainer::train::LrSchedule;
use std::path::PathBuf;

fn write(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cannon-train-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn err(file: Option<&str>, sets: &[&str]) -> String {
    // One file per call: the tests of this binary run in parallel, and a shared name let one
    // test load the file another had just rewritten.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = file.map(|t| write(&format!("bad-{n}.toml"), t));
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    match TrainConfig::load(path.as_deref(), &sets) {
        Ok(c) => panic!("accepted {file:?} {sets:?}: {c:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn defaults_are_the_tiny_run() {
    let c = TrainConfig::load(None, &[]).unwrap();
    assert_eq!(c, TrainConfig::default());
    assert_eq!(c.model.config, "tiny");
    assert!(c.is_preset());
    // A preset starts from random weights: every part trains.
    assert!(c.frozen().is_empty());
    assert_eq!(c.train.dtype, Precision::F32);
    assert_eq!(c.train.schedule, Schedule::Cosine);
    assert_eq!(c.parallel.nproc, 1);
    assert_eq!(c.checkpoint.resume, Resume::Latest(false));
    assert!(c.data.dataset.is_none());
}

#[test]
fn a_file_and_overrides_are_read_in_order() {
    let p = write(
        "run.toml",
        r#"
[model]
config = "some/hf/dir"
seed = 3

[data]
dataset = "a/train.jsonl"
packing = true

[train]
lr = 1e-3
betas = [0.8, 0.9]
dtype = "bf16"
epochs = 2.5

[checkpoint]
resume = "ckpt/step-100"
"#,
    );
    let sets = [
        "train.lr=5e-4".to_string(),
        "train.micro_batch=4".to_string(),
        "data.dataset=b/other.jsonl".to_string(),
        "model.freeze=[\"vision\"]".to_string(),
        "train.schedule=constant".to_string(),
        "data.cache_dir=/scratch/idx".to_string(),
    ];
    let c = TrainConfig::load(Some(&p), &sets).unwrap();
    assert_eq!(c.model.config, "some/hf/dir");
    assert_eq!(c.model.seed, 3);
    assert_eq!(c.train.lr, 5e-4, "the later --set wins over the file");
    assert_eq!(c.train.micro_batch, 4);
    assert_eq!(c.train.betas, [0.8, 0.9]);
    assert_eq!(c.train.dtype, Precision::Bf16);
    assert_eq!(c.train.epochs, Some(2.5));
    assert_eq!(c.train.schedule, Schedule::Constant);
    assert!(c.data.packing);
    // An unquoted path is taken as a string.
    assert_eq!(c.data.dataset, Some(PathBuf::from("b/other.jsonl")));
    assert_eq!(c.data.cache_dir, Some(PathBuf::from("/scratch/idx")));
    assert_eq!(c.frozen(), vec![Part::Vision]);
    assert_eq!(c.checkpoint.resume, Resume::Path("ckpt/step-100".into()));
    // An HF directory with no freeze list freezes vision tower and projector.
    let hf = TrainConfig::load(Some(&p), &[]).unwrap();
    assert!(!hf.is_preset());
    assert_eq!(hf.frozen(), vec![Part::Vision, Part::Projector]);
}

#[test]
fn the_saved_toml_reads_back_the_same() {
    let sets = ["train.steps=7".to_string(), "log.dir=runs/x".to_string()];
    let c = TrainConfig::load(None, &sets).unwrap();
    let back = TrainConfig::from_toml(&c.to_toml()).unwrap();
    assert_eq!(back, c);
}

#[test]
fn unknown_keys_and_sections_are_named() {
    let e = err(Some("[train]\nlr = 1e-3\nlearning_rate = 2\n"), &[]);
    assert!(e.contains("train.learning_rate: unknown key"), "{e}");
    let e = err(Some("[optimizer]\nlr = 1\n"), &[]);
    assert!(e.contains("unknown section [optimizer]"), "{e}");
    let e = err(None, &["train.lrr=1"]);
    assert!(e.contains("train.lrr: unknown key"), "{e}");
    // The index cache's key is `cache_dir`, named in the list of the section's keys.
    let e = err(None, &["data.cache=/tmp/idx"]);
    assert!(
        e.contains("data.cache: unknown key") && e.contains("cache_dir"),
        "{e}"
    );
    let e = err(None, &["trian.lr=1"]);
    assert!(e.contains("unknown section \"trian\""), "{e}");
    let e = err(None, &["lr=1"]);
    assert!(e.contains("section.key"), "{e}");
    let e = err(None, &["train.lr"]);
    assert!(e.contains("section.key=value"), "{e}");
}

#[test]
fn bad_values_are_named() {
    let cases: [(&str, &str); 14] = [
        ("train.lr=-1", "train.lr = -1: must be > 0"),
        ("train.lr=abc", "train.lr: invalid type"),
        ("train.micro_batch=0", "train.micro_batch = 0: must be > 0"),
        ("train.grad_accum=0", "train.grad_accum = 0: must be > 0"),
        ("train.steps=0", "train.steps = 0: must be > 0"),
        ("train.epochs=-2", "train.epochs = -2: must be > 0"),
        ("train.dtype=f16", "train.dtype: unknown variant `f16`"),
        (
            "train.betas=[0.9, 1.0]",
            "train.betas = [0.9, 1.0]: beta2 = 1 must be in [0, 1)",
        ),
        ("train.min_lr=1", "train.min_lr = 1: must be <= train.lr"),
        (
            "train.max_grad_norm=-1",
            "train.max_grad_norm = -1: must be >= 0",
        ),
        ("data.max_len=0", "data.max_len = 0: must be > 0"),
        ("data.longest_edge=0", "data.longest_edge = 0: must be > 0"),
        (
            "checkpoint.keep_last=0",
            "checkpoint.keep_last = 0: must be > 0",
        ),
        ("log.every=0", "log.every = 0: must be > 0"),
    ];
    for (set, want) in cases {
        let e = err(None, &[set]);
        assert!(e.contains(want), "--set {set}: {e}");
    }
    let e = err(None, &["train.steps=10", "train.epochs=1"]);
    assert!(e.contains("either train.steps or train.epochs"), "{e}");
    let e = err(None, &["data.cache_dir=\"\""]);
    assert!(
        e.contains("data.cache_dir = \"\": must name a folder"),
        "{e}"
    );
    let e = err(None, &["checkpoint.resume=3"]);
    assert!(e.contains("checkpoint.resume"), "{e}");
    // Several ranks are sharded ranks: unsharded data parallelism is a clear error.
    let e = err(None, &["parallel.nproc=2", "parallel.fsdp=false"]);
    assert!(
        e.contains("parallel.fsdp = false") && e.contains("not implemented"),
        "{e}"
    );
    // A file's own mistakes are reported against the file.
    let e = err(Some("[train]\nlr = \"fast\"\n"), &[]);
    assert!(e.contains("bad-") && e.contains("train.lr"), "{e}");
    let e = err(Some("[train\n"), &[]);
    assert!(e.contains("bad-"), "{e}");
}

#[test]
fn a_missing_config_file_is_named() {
    let p = std::env::temp_dir().join("cannon-no-such-config.toml");
    let e = TrainConfig::load(Some(&p), &[]).unwrap_err().to_string();
    assert!(e.contains("cannon-no-such-config.toml"), "{e}");
}

/// Values worked out by hand from the formula in the schedule's docs.
#[test]
fn lr_schedule_matches_hand_computed_values() {
    let s = LrSchedule {
        kind: Schedule::Cosine,
        lr: 1e-3,
        min_lr: 1e-4,
        warmup_steps: 4,
        total_steps: 14,
    };
    // Warm-up: lr * (s + 1) / 4.
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-15 * b.abs().max(1e-3);
    for (step, want) in [(0, 2.5e-4), (1, 5e-4), (2, 7.5e-4), (3, 1e-3)] {
        assert!(
            close(s.at(step), want),
            "step {step}: {} vs {want}",
            s.at(step)
        );
    }
    // Cosine over 10 steps: progress (s - 4) / 10.
    // s = 4: cos(0) = 1 -> lr. s = 9: cos(pi/2) = 0 -> (lr + min) / 2 = 5.5e-4.
    // s = 6: (1 + cos(0.2 pi)) / 2 = (1 + 0.809016994) / 2 = 0.904508497 -> 1e-4 + 9e-4 *
    // 0.904508497 = 9.14057647e-4. s = 13: (1 + cos(0.9 pi)) / 2 = (1 - 0.951056516) / 2 =
    // 0.024471742 -> 1.22024568e-4. Past the end it stays at min_lr.
    for (step, want) in [
        (4, 1e-3),
        (6, 9.140576474687264e-4),
        (9, 5.5e-4),
        (13, 1.2202456766718e-4),
        (14, 1e-4),
        (20, 1e-4),
    ] {
        assert!(
            (s.at(step) - want).abs() < 1e-12,
            "step {step}: {} vs {want}",
            s.at(step)
        );
    }
    let c = LrSchedule {
        kind: Schedule::Constant,
        warmup_steps: 0,
        ..s
    };
    assert!((0..20).all(|k| c.at(k) == 1e-3));
    let no_warmup = LrSchedule {
        warmup_steps: 0,
        ..s
    };
    assert_eq!(no_warmup.at(0), 1e-3);
}

#[test]
fn parallel_device_is_cpu_or_npu_and_npu_needs_the_feature() {
    let load = |sets: &[&str]| {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        cannon_trainer::train::config::TrainConfig::load(None, &sets)
    };
    let e = load(&["parallel.device=gpu"]).unwrap_err().to_string();
    assert!(e.contains("parallel.device"), "{e}");
    let npu = load(&["parallel.device=npu"]);
    if cfg!(feature = "npu") {
        npu.unwrap();
        let e = load(&["parallel.device=npu", "parallel.nproc=2"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("parallel.nproc = 2") && e.contains("cannon launch"),
            "{e}"
        );
        // Context parallelism on the NPU: the launched processes are the ranks, so the
        // config leaves cp_size to the run's check against the job (test `train_npu`).
        load(&[
            "parallel.device=npu",
            "parallel.cp_size=2",
            "parallel.cp_algo=ring",
        ])
        .unwrap();
    } else {
        let e = npu.unwrap_err().to_string();
        assert!(
            e.contains("parallel.device = npu") && e.contains("--features npu"),
            "{e}"
        );
    }
}
