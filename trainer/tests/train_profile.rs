//! The step profiler (`train.profile_steps`): a Chrome trace of the asked steps with, per
//! rank, the step, every layer's forward and backward, each op class, the collectives, the
//! copies and the data loading, and nothing of the other steps.

mod common;
use common::{scratch, small_default_train};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_cannon");

#[test]
fn a_trace_holds_every_layer_op_class_and_collective_of_the_profiled_step() {
    let dir = scratch("train-profile", "two-ranks");
    let sets = [
        "train.steps=3",
        "parallel.nproc=2",
        "train.profile_steps=[2, 2]",
    ];
    let out = small_default_train(BIN, &dir, &sets).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // 1: trained, the default's held-out accuracy below its targets after 3 steps.
    assert!(matches!(out.status.code(), Some(0 | 1)), "{err}");
    assert!(err.contains("trace of steps 2..=2"), "{err}");
    let trace: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("trace.json")).unwrap()).unwrap();
    let model: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("final").join("config.json")).unwrap(),
    )
    .unwrap();
    let layers = |part: &str| model[part]["num_hidden_layers"].as_u64().unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let mut names: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    let mut cats: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    let mut steps: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for e in events.iter().filter(|e| e["ph"] == "X") {
        let pid = e["pid"].as_u64().unwrap();
        let name = e["name"].as_str().unwrap().to_string();
        let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
        assert!(dur >= 0.0, "{e}");
        if name.starts_with("step ") {
            steps.insert(pid, (ts, ts + dur));
        }
        names.entry(pid).or_default().insert(name);
        cats.entry(pid)
            .or_default()
            .insert(e["cat"].as_str().unwrap().to_string());
    }
    assert_eq!(names.keys().copied().collect::<Vec<_>>(), [0, 1]);
    for (rank, names) in &names {
        // Only step 2: no span of steps 1 or 3.
        assert!(names.contains("step 2"), "rank {rank}: {names:?}");
        assert!(!names.contains("step 1") && !names.contains("step 3"));
        for l in 0..layers("text_config") {
            for dir in ["forward", "backward"] {
                let want = format!("text layer {dir} {l}");
                assert!(names.contains(&want), "rank {rank}: no {want} in {names:?}");
            }
        }
        for l in 0..layers("vision_config") {
            let want = format!("vision layer forward {l}");
            assert!(names.contains(&want), "rank {rank}: no {want} in {names:?}");
        }
        for want in [
            "head forward",
            "head backward",
            "projector forward",
            "data",
            "adamw",
        ] {
            assert!(names.contains(want), "rank {rank}: no {want} in {names:?}");
        }
        let cats = &cats[rank];
        for want in [
            "step",
            "layer",
            "gemm",
            "attention",
            "norm",
            "loss",
            "optimizer",
            "collective",
            "copy",
            "data",
        ] {
            assert!(
                cats.contains(want),
                "rank {rank}: no {want} span in {cats:?}"
            );
        }
    }
    // The step records carry the worst rank's memory peaks beside rank 0's.
    let metrics = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    for line in metrics.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        if r.get("loss").is_none() {
            continue;
        }
        for k in ["max_allocated_mib", "max_reserved_mib"] {
            let (rank0, worst) = (
                r[k].as_f64().unwrap(),
                r[&format!("{k}_worst_rank")].as_f64(),
            );
            assert!(worst.is_some_and(|w| w >= rank0 && w > 0.0), "{r}");
        }
    }
    // Every span of a rank lies within its step (the trace is the step, nothing else).
    for e in events.iter().filter(|e| e["ph"] == "X") {
        let (a, b) = steps[&e["pid"].as_u64().unwrap()];
        let ts = e["ts"].as_f64().unwrap();
        assert!(
            ts >= a - 1.0 && ts <= b + 1.0,
            "{e} outside the step [{a}, {b}]"
        );
    }
}

#[test]
fn a_bad_profile_range_is_refused_by_name() {
    let dir = scratch("train-profile", "refused");
    let out = Command::new(BIN)
        .arg("train")
        .args(["--set", "train.profile_steps=[3, 2]"])
        .args(["--set", &format!("log.dir={:?}", dir.display().to_string())])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("train.profile_steps"), "{err}");
}
