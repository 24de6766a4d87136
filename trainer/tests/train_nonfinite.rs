//! A run whose steps turn non-finite: each such step is skipped (logged `skipped: true`, not
//! applied), and `train.max_skipped_steps` of them in a row stop the run with an error that
//! says why, instead of training on.

mod common;
use common::{scratch, small_default_train};

const BIN: &str = env!("CARGO_BIN_EXE_cannon");

/// `cannon train` of the tiny default on a small synthetic set at lr = 1e30 (no warm-up),
/// micro batches of 4, with `extra` overrides, into a fresh folder `name`: that folder and
/// the process's stderr, the run having failed.
fn absurd_run(name: &str, extra: &[&str]) -> (std::path::PathBuf, String) {
    let run = scratch("train-nonfinite", name);
    let mut sets = vec!["train.lr=1e30", "train.warmup_steps=0"];
    sets.extend_from_slice(extra);
    let mut cmd = small_default_train(BIN, &run, &sets);
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{err}");
    (run, err)
}

/// lr = 1e30: the first update makes weights of ~1e30, after which every loss overflows.
#[test]
fn an_absurd_learning_rate_is_skipped_then_stops_the_run() {
    let (run, err) = absurd_run("absurd", &["train.steps=20", "train.max_skipped_steps=2"]);
    assert!(
        err.contains("3 step(s) in a row") && err.contains("max_skipped_steps = 2"),
        "{err}"
    );
    let log = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let steps: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v.get("step").is_some())
        .collect();
    let skipped: Vec<u64> = steps
        .iter()
        .filter(|v| v["skipped"] == true)
        .map(|v| v["step"].as_u64().unwrap())
        .collect();
    // Steps 2 and 3 logged as skipped (step 4, the third in a row, stopped the run first).
    assert_eq!(skipped, [2, 3], "{log}");
    assert_eq!(steps[0]["skipped_steps"], 0);
    assert_eq!(steps.last().unwrap()["skipped_steps"], 2);
    assert!(steps.iter().all(|v| v["skipped"] != true || v["lr"] == 0.0));
}

/// The same learning rate with a checkpoint after every step: the first step's weights
/// (~1e30) are past `train.max_abs_weight`, so that checkpoint is refused and none exists.
#[test]
fn a_diverged_model_is_never_checkpointed() {
    let (run, err) = absurd_run("no-ckpt", &["train.steps=5", "checkpoint.every=1"]);
    assert!(
        err.contains("step 1: param/") && err.contains("max_abs_weight = 1e6"),
        "{err}"
    );
    let committed: Vec<_> = std::fs::read_dir(run.join("checkpoints"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("step-") && !n.ends_with(".tmp"))
                .collect()
        })
        .unwrap_or_default();
    assert!(committed.is_empty(), "{committed:?}");
}
