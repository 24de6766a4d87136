//! `cannon bench features` end to end on a small config: the rows it measures (recompute:
//! the same losses bit for bit, a lower allocator peak; chunked loss within float rounding)
//! and context parallel (ulysses: the data-parallel run's losses within float rounding), in
//! the printed table and in the JSON file.

mod common;

use cannon_trainer::train::data::synth;
use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_cannon");

fn tmp(name: &str) -> PathBuf {
    common::scratch("bench-features", name)
}

#[test]
fn feature_table_measures_memory_and_cp_rows() {
    let dir = tmp("table");
    let data = dir.join("data");
    synth::write(&data, 60, 5).unwrap();
    let cfg = dir.join("small.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
[model]
config = "tiny"
seed = 1

[data]
dataset = "{data}/train.jsonl"
tokenizer = "{tok}"
vocab_size = 1280
max_len = 256
longest_edge = 56

[train]
micro_batch = 4
lr = 1e-3
warmup_steps = 2
"#,
            data = data.display(),
            tok = common::tekken().display(),
        ),
    )
    .unwrap();
    let json = dir.join("rows.json");
    let o = Command::new(BIN)
        .args(["bench", "features", "--config"])
        .arg(&cfg)
        .args(["--json"])
        .arg(&json)
        .args([
            "--only",
            "recompute",
            "--only",
            "chunk_loss",
            "--only",
            "ulysses",
        ])
        .args(["--set", "train.loss_chunk=0"])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    for name in ["recompute", "chunk_loss", "ulysses", "loss diff", "noise"] {
        assert!(
            stdout.contains(name),
            "{name} missing from the table:\n{stdout}"
        );
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["steps"], 20);
    assert_eq!(v["from_step"], 6);
    let rows = v["rows"].as_array().unwrap();
    let row = |name: &str| rows.iter().find(|r| r["feature"] == name).unwrap().clone();
    assert_eq!(rows.len(), 3, "{v:#}");

    // Recompute runs the same kernels in the same order: the same losses exactly, and less
    // memory at the peak (the same config repeated is deterministic too: noise 0).
    let r = row("recompute");
    assert_eq!(r["available"], true, "{r:#}");
    assert_eq!(r["loss_diff"], 0.0, "{r:#}");
    assert_eq!(r["noise"]["loss_diff"], 0.0, "{r:#}");
    let change = r["max_allocated_mib"]["change"].as_f64().unwrap();
    assert!(change < 0.0, "recompute must lower max allocated: {r:#}");

    // The chunked loss only reorders f32 sums: differences at rounding level, far under the
    // seed's 0.16 % (1e-5 leaves room for 20 steps of AdamW amplifying them).
    let c = row("chunk_loss");
    assert_eq!(c["available"], true, "{c:#}");
    let d = c["loss_diff"].as_f64().unwrap();
    assert!(d < 1e-5, "{c:#}");

    // Context parallel runs (its keys exist): the same losses as data parallel on as many
    // ranks, to float rounding (CP regroups sums; the bar as for the chunked loss).
    let u = row("ulysses");
    assert_eq!(u["available"], true, "{u:#}");
    assert!(u["loss_diff"].as_f64().unwrap() < 1e-5, "{u:#}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn unknown_rows_and_bad_configs_are_usage_errors() {
    let dir = tmp("bad");
    let json = dir.join("rows.json");
    let run = |args: &[&str]| {
        let o = Command::new(BIN)
            .args(["bench", "features", "--json"])
            .arg(&json)
            .args(args)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["--only", "zero3"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("zero3") && err.contains("offload_optimizer"),
        "{err}"
    );
    let (code, err) = run(&["--set", "train.recompute=sometimes"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("train.recompute"), "{err}");
    assert!(!json.exists(), "no rows written for an unusable config");
    std::fs::remove_dir_all(&dir).ok();
}

/// The deeper bench config that docs/benchmarks.md's second feature table runs is a valid run
/// config whose model is the default's sizes with 8 decoder layers.
#[test]
fn shipped_deep_config_is_valid() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text =
        std::fs::read_to_string(root.join("trainer/benches/configs/tiny-deep.toml")).unwrap();
    let cfg = cannon_trainer::train::config::TrainConfig::from_toml(&text).unwrap();
    cfg.validate().unwrap();
    let model = cannon_trainer::model::Mistral3Config::from_file(
        &root.join("trainer/benches/configs/tiny-deep/config.json"),
    )
    .unwrap();
    model.validate().unwrap();
    assert_eq!(model.text_config.num_hidden_layers, 8);
    assert!(cfg.data.packing && cfg.data.max_len == 512);
}
