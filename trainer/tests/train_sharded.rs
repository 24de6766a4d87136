//! `cannon train` with `parallel.nproc > 1`: the run's loop on CPU ranks of an FSDP run
//! follows the one-rank loop step for step (same global batch, same loss normalisation), with
//! an uneven split of rows (8 rows over 3 ranks) and gradient accumulation.

mod common;

use cannon_trainer::config::TrainConfig;
use cannon_trainer::data::synth;
use cannon_trainer::model::Exec;
use cannon_trainer::train::sharded::run_sharded;
use cannon_trainer::train::{RunPlan, RunSetup, RunSummary};
use std::path::{Path, PathBuf};

fn dataset(root: &Path) -> PathBuf {
    synth::write(&root.join("data"), 40, 5).unwrap().train
}

/// Six steps of 2 micro batches of 8 rows of the tiny preset on `nproc` ranks.
fn train(root: &Path, data: &Path, nproc: usize) -> (RunSummary, Vec<String>) {
    let tok = common::shared_path("tokenizers/tekken_240911.json");
    let dir = root.join(format!("run{nproc}"));
    let sets: Vec<String> = [
        format!("data.dataset={:?}", data.display().to_string()),
        format!("data.tokenizer={:?}", tok.display().to_string()),
        format!("log.dir={:?}", dir.display().to_string()),
        "train.steps=6".into(),
        "train.micro_batch=8".into(),
        "train.grad_accum=2".into(),
        "train.warmup_steps=2".into(),
        format!("parallel.nproc={nproc}"),
    ]
    .into();
    let cfg = TrainConfig::load(None, &sets).unwrap();
    let plan = RunPlan::resolve(cfg, None).unwrap();
    let mut setup = RunSetup::new(plan, &Exec::cpu()).unwrap();
    let summary = run_sharded(&mut setup).unwrap();
    let metrics = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    assert!(summary.final_model.join("model.safetensors").is_file());
    (summary, metrics.lines().map(str::to_string).collect())
}

#[test]
fn three_ranks_follow_the_one_rank_run() {
    let root = std::env::temp_dir().join(format!("cannon-train-sharded-{}", std::process::id()));
    std::fs::remove_dir_all(&root).ok();
    let data = dataset(&root);
    let (one, one_lines) = train(&root, &data, 1);
    let (three, three_lines) = train(&root, &data, 3);
    assert_eq!(three.steps, 6);
    assert_eq!(three_lines.len(), one_lines.len());
    let num: f64 = one
        .losses
        .iter()
        .zip(&three.losses)
        .map(|(a, b)| (a - b).abs())
        .sum();
    let d = num / one.losses.iter().sum::<f64>();
    // The bar of the FSDP equivalence tests: only the order of f32 gradient sums differs.
    assert!(
        d <= 1e-5,
        "3 vs 1 rank loss diff {d:e}: {:?} vs {:?}",
        three.losses,
        one.losses
    );
    // The records agree on everything the ranks do not change.
    for (a, b) in one_lines.iter().zip(&three_lines) {
        let (a, b): (serde_json::Value, serde_json::Value) = (
            serde_json::from_str(a).unwrap(),
            serde_json::from_str(b).unwrap(),
        );
        for key in ["step", "lr", "targets", "samples", "tokens"] {
            assert_eq!(a[key], b[key], "{key}: {a} vs {b}");
        }
    }
    std::fs::remove_dir_all(&root).ok();
}
