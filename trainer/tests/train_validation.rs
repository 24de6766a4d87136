//! Validation during training (`train.eval_every`): the held-out loss every N steps and after
//! the last, logged as its own records, on one rank and on two, with the training losses of
//! a run without validation bit for bit; `data.eval_split` holds a fraction of the training
//! set out of the training and scores it instead; the keys' misuses are refused by name.

mod common;
use common::{scratch, small_default_train};
use serde_json::Value;
use std::path::Path;

const BIN: &str = env!("CARGO_BIN_EXE_cannon");

/// `cannon train` of the tiny default on a small synthetic set (6 steps of 4 rows), with
/// `extra` overrides, into `dir`: its exit status and stderr (a run that trained exits 0,
/// or 1 when the default's held-out accuracy is below its targets, as 6 steps leave it).
fn run(dir: &Path, extra: &[&str]) -> (std::process::ExitStatus, String) {
    let mut sets = vec!["train.steps=6", "train.eval_batch=8"];
    sets.extend_from_slice(extra);
    let mut cmd = small_default_train(BIN, dir, &sets);
    let out = cmd.output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The records of a run's metrics.jsonl.
fn records(dir: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// (step, loss, grad_norm) of the step records, as written.
fn steps(recs: &[Value]) -> Vec<(u64, f64, f64)> {
    recs.iter()
        .filter(|r| r.get("loss").is_some())
        .map(|r| {
            let f = |k: &str| r[k].as_f64().unwrap();
            (r["step"].as_u64().unwrap(), f("loss"), f("grad_norm"))
        })
        .collect()
}

fn evals(recs: &[Value]) -> Vec<&Value> {
    recs.iter()
        .filter(|r| r.get("eval_loss").is_some())
        .collect()
}

/// Every 4 steps and after the last (6): records at steps 4 and 6, the synthetic default's
/// accuracy with them, and the training exactly as without validation, on 1 and 2 ranks.
#[test]
fn validation_is_logged_and_leaves_training_bit_identical() {
    for nproc in [1, 2] {
        let root = scratch("train-validation", &format!("ranks{nproc}"));
        let ranks = format!("parallel.nproc={nproc}");
        let (st, err) = run(&root.join("plain"), &[&ranks]);
        assert!(matches!(st.code(), Some(0 | 1)), "{err}");
        let (st, err) = run(&root.join("validated"), &[&ranks, "train.eval_every=4"]);
        assert!(matches!(st.code(), Some(0 | 1)), "{err}");
        let plain = records(&root.join("plain"));
        let validated = records(&root.join("validated"));
        assert_eq!(steps(&plain).len(), 6);
        assert_eq!(steps(&validated), steps(&plain), "{nproc} rank(s)");
        assert!(evals(&plain).is_empty());
        let ev = evals(&validated);
        let at: Vec<u64> = ev.iter().map(|r| r["step"].as_u64().unwrap()).collect();
        assert_eq!(at, [4, 6], "{nproc} rank(s)");
        for r in &ev {
            let loss = r["eval_loss"].as_f64().unwrap();
            assert!(loss.is_finite() && loss > 0.0, "{r}");
            // 20 held-out samples (one in ten of 200), each with a trained answer.
            assert_eq!(r["eval_samples"], 20, "{r}");
            assert!(r["eval_tokens"].as_u64().unwrap() >= 20, "{r}");
            let acc = r["eval_accuracy"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&acc), "{r}");
            assert!(r.get("eval_accuracy_colour").is_some(), "{r}");
        }
        assert!(err.contains("eval step 4: loss"), "{err}");
    }
}

/// The held-out loss is the mean over the set's trained targets: the same set scored from
/// one rank and from two gives the same figure up to the order of f32 sums.
#[test]
fn the_validation_loss_does_not_depend_on_the_ranks() {
    let root = scratch("train-validation", "world");
    let mut first = Vec::new();
    for nproc in [1, 2] {
        let dir = root.join(format!("n{nproc}"));
        let ranks = format!("parallel.nproc={nproc}");
        // One step at a learning rate that moves nothing measurable: the same weights.
        let (st, err) = run(
            &dir,
            &[
                &ranks,
                "train.steps=1",
                "train.lr=1e-12",
                "train.min_lr=0",
                "train.eval_every=1",
            ],
        );
        assert!(matches!(st.code(), Some(0 | 1)), "{err}");
        let recs = records(&dir);
        first.push(evals(&recs)[0]["eval_loss"].as_f64().unwrap());
    }
    // f32 activations summed in another order: agree to 1e-5 of the loss.
    assert!(
        (first[0] - first[1]).abs() <= 1e-5 * first[0],
        "1 rank {} vs 2 ranks {}",
        first[0],
        first[1]
    );
}

/// `data.eval_split = 0.25`: a quarter of the training set is held out (and never trained
/// on) and is what the validation and the final evaluation score.
#[test]
fn an_eval_split_holds_part_of_the_training_set_out() {
    let dir = scratch("train-validation", "split");
    let (st, err) = run(&dir, &["data.eval_split=0.25", "train.eval_every=3"]);
    assert!(matches!(st.code(), Some(0 | 1)), "{err}");
    let recs = records(&dir);
    let ev = evals(&recs);
    assert_eq!(ev.len(), 2);
    // 180 training samples of the synthetic set: 45 held out, 135 trained.
    assert_eq!(ev[0]["eval_samples"], 45, "{}", ev[0]);
    assert!(err.contains("135 samples"), "{err}");
    let final_eval = recs.iter().find(|r| r.get("eval").is_some()).unwrap();
    assert_eq!(final_eval["eval"]["samples"], 45, "{final_eval}");
    // The effective config keeps the split, so `cannon eval` of the run reads the same set.
    let cfg = std::fs::read_to_string(dir.join("config.toml")).unwrap();
    assert!(cfg.contains("eval_split = 0.25"), "{cfg}");
}

#[test]
fn misused_validation_keys_are_refused_by_name() {
    let dir = scratch("train-validation", "refused");
    let (st, err) = run(
        &dir,
        &["data.eval_split=0.1", "data.eval_dataset=\"held.jsonl\""],
    );
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(
        err.contains("data.eval_split") && err.contains("not both"),
        "{err}"
    );
    let (st, err) = run(&dir, &["data.eval_split=1.5"]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(
        err.contains("data.eval_split") && err.contains("[0, 1)"),
        "{err}"
    );
    let (st, err) = run(
        &dir,
        &["data.dataset=\"train.jsonl\"", "train.eval_every=10"],
    );
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(
        err.contains("train.eval_every") && err.contains("held-out"),
        "{err}"
    );
}
