//! `cannon export`: a checkpoint's model written as an HF checkpoint reads back with
//! `Mistral3::load` to the same tensors, carries exactly the tensor names (and shapes) of the
//! reference HF checkpoint `mistral3-tiny` (no missing, no unexpected keys), and a sharded
//! export's `model.safetensors.index.json` maps every tensor to the file that holds it.

mod common;

use cannon_trainer::model::optim::{AdamW, AdamWConfig};
use cannon_trainer::model::{Mistral3, Part, Precision};
use cannon_trainer::train::checkpoint::{
    export, Checkpoint, CheckpointDir, DataState, ExportOptions, Progress, Snapshot,
};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_cannon");

fn tiny_dir() -> PathBuf {
    common::shared_path("reference/mistral3-tiny/model.safetensors");
    common::shared_path("reference/mistral3-tiny")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cannon-export-{}-{name}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    d
}

/// Names and shapes of a safetensors file's tensors.
fn names_and_shapes(path: &Path) -> BTreeMap<String, Vec<usize>> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| (n, v.shape().to_vec()))
        .collect()
}

/// A checkpoint of the reference model as a run that trained its text part would save it
/// (the weights as loaded, the run's config.json verbatim), in `root`.
fn checkpoint_of_reference(root: &Path) -> Mistral3 {
    let model = Mistral3::load(&tiny_dir()).unwrap();
    let grads = model.grads(&[Part::Text]).unwrap();
    let opt = AdamW::new(&model.exec, AdamWConfig::default(), &grads).unwrap();
    let raw = std::fs::read_to_string(tiny_dir().join("config.json")).unwrap();
    let state = Snapshot {
        model_config: serde_json::from_str(&raw).unwrap(),
        model: model.try_clone().unwrap(),
        opt,
        progress: Progress {
            step: 4,
            config: json!({}),
            scheduler: json!({}),
            data: DataState::default(),
            rng: 0,
        },
    };
    state.save(&CheckpointDir::new(root), 0).unwrap();
    model
}

fn assert_same_params(a: &Mistral3, b: &Mistral3, what: &str) {
    let st = a.exec.stream();
    for (g, (x, y)) in a.params.data.iter().zip(&b.params.data).enumerate() {
        let (x, y) = (x.to_host(st).unwrap(), y.to_host(st).unwrap());
        assert!(
            x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
            "{what}: group {g} differs"
        );
    }
}

#[test]
fn export_loads_back_identically_with_the_reference_names() {
    let root = scratch("single");
    let model = checkpoint_of_reference(&root.join("ckpt"));
    let out = root.join("hf");
    let mut ckpt = Checkpoint::open(&root.join("ckpt")).unwrap();
    let report = export(&mut ckpt, &out, &ExportOptions::default()).unwrap();
    assert_eq!(report.files, vec!["model.safetensors".to_string()]);
    assert!(!out.join("model.safetensors.index.json").exists());

    // Exactly the reference's tensors: no missing, no unexpected, same shapes.
    let reference = names_and_shapes(&tiny_dir().join("model.safetensors"));
    let exported = names_and_shapes(&out.join("model.safetensors"));
    assert_eq!(exported, reference);
    assert_eq!(report.tensors, reference.len());
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        config["architectures"][0],
        "Mistral3ForConditionalGeneration"
    );
    assert_eq!(config["dtype"], "float32");
    assert_eq!(config["text_config"]["vocab_size"], 384);

    let back = Mistral3::load(&out).unwrap();
    assert_same_params(&model, &back, "f32 export");

    // An occupied --out is refused unless forced.
    let err = export(&mut ckpt, &out, &ExportOptions::default()).unwrap_err();
    assert!(err.to_string().contains("--force"), "{err}");
    let forced = ExportOptions {
        force: true,
        ..ExportOptions::default()
    };
    export(&mut ckpt, &out, &forced).unwrap();
}

#[test]
fn sharded_export_writes_an_index_that_round_trips() {
    let root = scratch("sharded");
    let model = checkpoint_of_reference(&root.join("ckpt"));
    let out = root.join("hf");
    let mut ckpt = Checkpoint::open(&root.join("ckpt")).unwrap();
    // 454 KB of f32 tensors in files of at most 100 KB (the embedding and lm_head, 74 KB
    // each, take one file apiece).
    let opts = ExportOptions {
        max_shard_size: 100_000,
        ..ExportOptions::default()
    };
    let report = export(&mut ckpt, &out, &opts).unwrap();
    let n = report.files.len();
    assert!(n >= 5, "{:?}", report.files);
    assert_eq!(
        report.files[0],
        format!("model-00001-of-{n:05}.safetensors")
    );
    assert!(!out.join("model.safetensors").exists());

    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    let map = index["weight_map"].as_object().unwrap();
    let mut total = 0u64;
    let mut seen = BTreeMap::new();
    for file in &report.files {
        let path = out.join(file);
        assert!(
            std::fs::metadata(&path).unwrap().len() <= 100_000 + 4096,
            "{file} too large"
        );
        for (name, shape) in names_and_shapes(&path) {
            assert_eq!(map[&name], json!(file), "{name} is mapped to its file");
            total += 4 * shape.iter().product::<usize>() as u64;
            seen.insert(name, shape);
        }
    }
    assert_eq!(map.len(), seen.len());
    assert_eq!(index["metadata"]["total_size"], json!(total));
    assert_eq!(
        seen,
        names_and_shapes(&tiny_dir().join("model.safetensors"))
    );

    let back = Mistral3::load(&out).unwrap();
    assert_same_params(&model, &back, "sharded export");
}

#[test]
fn bf16_export_rounds_to_nearest_even() {
    let root = scratch("bf16");
    let model = checkpoint_of_reference(&root.join("ckpt"));
    let out = root.join("hf");
    let mut ckpt = Checkpoint::open(&root.join("ckpt")).unwrap();
    let opts = ExportOptions {
        dtype: Precision::Bf16,
        ..ExportOptions::default()
    };
    let report = export(&mut ckpt, &out, &opts).unwrap();
    assert_eq!(
        report.total_bytes * 2,
        4 * model.params.layout.num_params() as u64
    );
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["dtype"], "bfloat16");
    let back = Mistral3::load(&out).unwrap();
    let st = model.exec.stream();
    for (x, y) in model.params.data.iter().zip(&back.params.data) {
        let want: Vec<f32> = x
            .to_host(st)
            .unwrap()
            .iter()
            .map(|v| half::bf16::from_f32(*v).to_f32())
            .collect();
        assert_eq!(y.to_host(st).unwrap(), want);
    }
}

#[test]
fn export_cli_writes_the_latest_checkpoint_and_refuses_bad_input() {
    let root = scratch("cli");
    let model = checkpoint_of_reference(&root.join("ckpt"));
    let out = root.join("hf");
    let run = |args: &[&str]| {
        let o = Command::new(BIN).arg("export").args(args).output().unwrap();
        (
            o.status.code().unwrap(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let ckpt = root.join("ckpt");
    let (code, err) = run(&[
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--max-shard-size",
        "200KB",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.join("model.safetensors.index.json").is_file());
    assert_same_params(&model, &Mistral3::load(&out).unwrap(), "cli export");

    let (code, err) = run(&[
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("--force"), "{err}");

    let empty = root.join("nothing");
    std::fs::create_dir_all(&empty).unwrap();
    let (code, err) = run(&[
        "--checkpoint",
        empty.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("no complete checkpoint"), "{err}");

    let (code, err) = run(&[
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--out",
        root.join("x").to_str().unwrap(),
        "--max-shard-size",
        "5XB",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("5XB"), "{err}");
}

/// An export builds in a folder of its own beside `--out` and never touches a `<out>.tmp` it
/// did not make; `--force` replaces an earlier export (marked, or an older cannon's without
/// the marker) and nothing else: not a run folder, not the checkpoint being read, not a
/// folder holding it or inside it.
#[test]
fn export_force_replaces_only_an_earlier_export() {
    use cannon_trainer::train::checkpoint::CheckpointError;
    let root = scratch("force");
    let model = checkpoint_of_reference(&root.join("run/checkpoints"));
    let src = root.join("run/checkpoints");
    let forced = ExportOptions {
        force: true,
        ..ExportOptions::default()
    };
    let out = root.join("hf");
    // Someone else's `hf.tmp`.
    std::fs::create_dir_all(root.join("hf.tmp")).unwrap();
    std::fs::write(root.join("hf.tmp/keep"), "mine").unwrap();
    let mut ckpt = Checkpoint::open(&src).unwrap();
    export(&mut ckpt, &out, &ExportOptions::default()).unwrap();
    assert!(out.join("cannon_export.json").is_file());
    // Again, forced over the earlier export; and over one without the marker.
    export(&mut ckpt, &out, &forced).unwrap();
    std::fs::remove_file(out.join("cannon_export.json")).unwrap();
    export(&mut ckpt, &out, &forced).unwrap();
    assert_same_params(&model, &Mistral3::load(&out).unwrap(), "forced export");
    assert_eq!(
        std::fs::read_to_string(root.join("hf.tmp/keep")).unwrap(),
        "mine"
    );
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["hf", "hf.tmp", "run"], "leftovers beside --out");

    // A run folder (here one whose checkpoints live elsewhere) is never replaced.
    let other_run = root.join("other-run");
    std::fs::create_dir_all(&other_run).unwrap();
    std::fs::write(other_run.join("metrics.jsonl"), "{}\n").unwrap();
    std::fs::write(other_run.join("config.json"), "{}\n").unwrap();
    let err = export(&mut ckpt, &other_run, &forced).unwrap_err();
    assert!(
        matches!(err, CheckpointError::NotAnExport { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("metrics.jsonl"), "{err}");
    assert!(other_run.join("metrics.jsonl").is_file());

    // The checkpoint itself, the folders holding it, a folder inside it: refused, forced or
    // not, and the checkpoint reads as before.
    let step_dir = ckpt.dir().to_path_buf();
    for bad in [
        step_dir.clone(),
        src.clone(),
        root.join("run"),
        step_dir.join("hf"),
    ] {
        for opts in [ExportOptions::default(), forced] {
            let err = export(&mut ckpt, &bad, &opts).unwrap_err();
            assert!(
                matches!(err, CheckpointError::OverlapsCheckpoint { .. }),
                "{}: {err:?}",
                bad.display()
            );
        }
    }
    assert!(!step_dir.join("hf").exists());
    let mut again = Checkpoint::open(&src).unwrap();
    assert_eq!(again.step(), 4);
    let out2 = root.join("hf2");
    export(&mut again, &out2, &ExportOptions::default()).unwrap();
    assert_same_params(&model, &Mistral3::load(&out2).unwrap(), "after refusals");

    // The CLI says so and exits 2.
    let o = Command::new(BIN)
        .args(["export", "--force", "--checkpoint"])
        .arg(&src)
        .arg("--out")
        .arg(root.join("run"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("overlaps the checkpoint being read"), "{err}");
}
