//! What the integration tests share: the path of a fixture under `../shared`, a fresh scratch
//! folder per test, and the HF config of a tiny Mistral3 that fits the data pipeline.

use std::path::PathBuf;

/// `../shared/<rel>` seen from the project root (the shared fixtures — tokenizers, reference
/// models, images — live in a folder beside the project, not in it). A missing path stops the
/// test with a message naming it, not with an unwrap backtrace further on.
pub fn shared_path(rel: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared")
        .join(rel);
    if !p.exists() {
        panic!(
            "missing ../shared/{rel} (looked at {}): the shared fixtures live beside the project \
             (see README)",
            p.display()
        );
    }
    p
}

/// The project's Tekken tokenizer file (`../shared/tokenizers/tekken_240911.json`).
#[allow(dead_code)] // not every test crate tokenizes
pub fn tekken() -> PathBuf {
    shared_path("tokenizers/tekken_240911.json")
}

/// An empty folder `<tmp>/cannon-<suite>-<pid>-<name>`, made anew for each test (the process
/// id keeps concurrent test binaries apart).
#[allow(dead_code)] // not every test crate writes files
pub fn scratch(suite: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cannon-{suite}-{}-{name}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
    d
}

/// The `config.json` of a tiny Mistral3 whose vocabulary (`vocab`), `[IMG]` id (`img`) and
/// patch size (14, merged 2x2) are the data pipeline's, with `vision_layers` Pixtral layers.
#[allow(dead_code)] // not every test crate builds a model
pub fn tiny_vlm_config_json(
    img: u32,
    vocab: impl std::fmt::Display,
    vision_layers: usize,
) -> String {
    format!(
        r#"{{
        "model_type": "mistral3", "image_token_index": {img}, "spatial_merge_size": 2,
        "projector_hidden_act": "gelu", "multimodal_projector_bias": false,
        "vision_feature_layer": -1,
        "text_config": {{
            "model_type": "mistral", "vocab_size": {vocab}, "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 512,
            "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "sliding_window": null
        }},
        "vision_config": {{
            "model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": {vision_layers}, "num_attention_heads": 2, "head_dim": 16,
            "num_channels": 3, "patch_size": 14, "image_size": 112, "rope_theta": 10000.0,
            "hidden_act": "silu"
        }}
    }}"#
    )
}

/// `cannon train` (the binary `bin`) of the tiny default on a small synthetic set (200
/// samples, micro batches of 4) into `dir`, with each of `sets` as a `--set` override: the
/// command line the CLI tests of a run share.
#[allow(dead_code)] // not every test crate trains
pub fn small_default_train(
    bin: &str,
    dir: &std::path::Path,
    sets: &[&str],
) -> std::process::Command {
    let mut cmd = std::process::Command::new(bin);
    cmd.arg("train")
        .args([
            "--set",
            "data.synth_samples=200",
            "--set",
            "train.micro_batch=4",
        ])
        .args(["--set", &format!("log.dir={:?}", dir.display().to_string())]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    cmd
}
