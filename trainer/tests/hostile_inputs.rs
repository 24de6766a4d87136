//! The crafted inputs of issue 27, through the `cannon` binary: each is refused with exit 2 and
//! an error naming the field, at once and without allocating what the file declares (before,
//! these aborted the process or exported the header's text as `lm_head`).

mod common;
use common::{scratch, shared_path, small_default_train};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_cannon");

/// Runs `cmd`, expects exit 2 and stderr containing `needle`.
fn refused(mut cmd: Command, needle: &str) {
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(needle), "wanted {needle:?} in:\n{err}");
}

/// The tiny reference config with `edit` applied, in `dir/config.json`.
fn config_with(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let text = std::fs::read_to_string(shared_path("reference/mistral3-tiny/config.json")).unwrap();
    let mut cfg: Value = serde_json::from_str(&text).unwrap();
    edit(&mut cfg);
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
}

#[test]
fn configs_declaring_huge_sizes_are_refused_naming_the_field() {
    let d = scratch("hostile", "config");
    let cases: [(&str, &str, Value); 3] = [
        ("hidden", "hidden_size", Value::from(1_000_000_000_000u64)),
        ("layers", "num_hidden_layers", Value::from(1_000_000_000u64)),
        ("vocab", "vocab_size", Value::from(1u64 << 60)),
    ];
    for (name, field, v) in cases {
        let model = d.join(name);
        config_with(&model, |c| c["text_config"][field] = v);
        let mut cmd = Command::new(BIN);
        cmd.arg("train")
            .args([
                "--set",
                &format!("model.config={:?}", model.display().to_string()),
            ])
            .args([
                "--set",
                &format!("log.dir={:?}", d.join("run").display().to_string()),
            ]);
        refused(cmd, &format!("text_config.{field}"));
    }
}

/// The safetensors header of `file` with `edit` applied, the data left as it was.
fn edit_header(file: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut header);
    let text = Value::Object(header).to_string().into_bytes();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(file, out).unwrap();
}

#[test]
fn damaged_checkpoints_are_refused_by_export() {
    let d = scratch("hostile", "ckpt");
    let run = d.join("run");
    let out = small_default_train(BIN, &run, &["train.steps=1", "checkpoint.every=1"])
        .output()
        .unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let good = run.join("checkpoints/step-000001");
    assert!(good.join("manifest.json").is_file());
    let copy = |name: &str| {
        let c = d.join(name);
        std::fs::create_dir_all(&c).unwrap();
        for e in std::fs::read_dir(&good).unwrap().flatten() {
            std::fs::copy(e.path(), c.join(e.file_name())).unwrap();
        }
        c
    };
    let export = |ckpt: &Path| {
        let mut cmd = Command::new(BIN);
        cmd.arg("export")
            .arg("--checkpoint")
            .arg(ckpt)
            .arg("--out")
            .arg(d.join(format!(
                "out-{}",
                ckpt.file_name().unwrap().to_string_lossy()
            )));
        cmd
    };

    // A world size of 10^12 is refused before a list of that many files is made.
    let world = copy("world");
    let path = world.join("manifest.json");
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    m["world_size"] = Value::from(1_000_000_000_000u64);
    std::fs::write(&path, m.to_string()).unwrap();
    refused(export(&world), "world_size");

    // A tensor whose offsets wrap 64 bits would read the header's text as its values.
    let wrap = copy("wrap");
    let shard = wrap.join("rank-00000-of-00001.safetensors");
    let mut victim = String::new();
    edit_header(&shard, |h| {
        let (name, e) = h
            .iter_mut()
            .find(|(k, _)| k.as_str() != "__metadata__")
            .unwrap();
        victim = name.clone();
        let o = e["data_offsets"].as_array().unwrap();
        let len = o[1].as_u64().unwrap() - o[0].as_u64().unwrap();
        let start = u64::MAX - len + 1 - 64;
        e["data_offsets"] = Value::from(vec![start, start + len]);
    });
    // The manifest records the shard's size: record the edited one, so that only the
    // offsets are wrong (a file replaced together with its manifest).
    let path = wrap.join("manifest.json");
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    m["files"][0]["bytes"] = Value::from(std::fs::metadata(&shard).unwrap().len());
    std::fs::write(&path, m.to_string()).unwrap();
    refused(export(&wrap), &victim);

    // The undamaged copy exports: the refusals were for the damage only.
    let ok = copy("ok");
    let out = export(&ok).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
