//! `cannon train` with `parallel.nproc > 1`: the run's loop on CPU ranks of an FSDP run
//! follows the one-rank loop step for step (same global batch, same loss normalisation), with
//! an uneven split of rows (8 rows over 3 ranks) and gradient accumulation; ranks that each
//! decode only their own rows skip the same undecodable samples as the one rank.

mod common;

use cannon_trainer::model::DeviceCtx;
use cannon_trainer::train::config::TrainConfig;
use cannon_trainer::train::data::synth;
use cannon_trainer::train::sharded::run_sharded;
use cannon_trainer::train::{ResolvedRun, RunSetup, RunSummary};
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
    let plan = ResolvedRun::resolve(cfg, None).unwrap();
    let mut setup = RunSetup::new(plan, &DeviceCtx::cpu()).unwrap();
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
    follow(&root, &data, 3, 0);
    std::fs::remove_dir_all(&root).ok();
}

/// Two images cut after their headers (they pass reading and fail when their batch is
/// made): each rank decodes only its own rows, yet every rank skips both samples, so the ranks'
/// batches stay the one rank's and the run counts each sample once.
#[test]
fn ranks_skip_the_samples_any_rank_could_not_decode() {
    let root = std::env::temp_dir().join(format!("cannon-train-skip-{}", std::process::id()));
    std::fs::remove_dir_all(&root).ok();
    let data = dataset(&root);
    let text = std::fs::read_to_string(&data).unwrap();
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let images = |r: &serde_json::Value| -> Vec<String> {
        let list = r["images"].as_array().cloned().unwrap_or_default();
        list.iter()
            .map(|i| i.as_str().unwrap().to_string())
            .collect()
    };
    let cut: Vec<String> = records.iter().flat_map(images).take(2).collect();
    assert_eq!(cut.len(), 2, "the synthetic set has images");
    for image in &cut {
        let path = data.parent().unwrap().join(image);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    }
    // Every sample showing a cut image is skipped; the 96 rows of the run cross the set twice.
    let bad = records
        .iter()
        .filter(|r| images(r).iter().any(|i| cut.contains(i)))
        .count();
    assert!(bad >= 2 && records.len() < 96, "{bad} of {}", records.len());
    follow(&root, &data, 2, bad as u64);
    std::fs::remove_dir_all(&root).ok();
}

/// Trains on one rank and on `nproc`, and checks the runs agree step for step, `skipped`
/// samples counted in each.
fn follow(root: &Path, data: &Path, nproc: usize, skipped: u64) {
    let (one, one_lines) = train(root, data, 1);
    let (three, three_lines) = train(root, data, nproc);
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
        "{nproc} vs 1 rank loss diff {d:e}: {:?} vs {:?}",
        three.losses,
        one.losses
    );
    // The records agree on everything the ranks do not change.
    for (a, b) in one_lines.iter().zip(&three_lines) {
        let (a, b): (serde_json::Value, serde_json::Value) = (
            serde_json::from_str(a).unwrap(),
            serde_json::from_str(b).unwrap(),
        );
        for key in [
            "step",
            "lr",
            "targets",
            "samples",
            "tokens",
            "skipped_samples",
        ] {
            assert_eq!(a[key], b[key], "{key}: {a} vs {b}");
        }
    }
    let last: serde_json::Value = serde_json::from_str(one_lines.last().unwrap()).unwrap();
    assert_eq!(last["skipped_samples"], skipped, "{last}");
}
