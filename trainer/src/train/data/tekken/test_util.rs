//! Small tekken.json files made in tests, and the real one.

use serde_json::{json, Value};
use std::path::PathBuf;

/// The project's real tokenizer file (mistral-common's tekken_240911.json).
pub(super) fn real_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/tokenizers/tekken_240911.json")
}

/// A v3 file of the 256 single bytes and then `merges`, with 20 specials and `pattern`.
pub(super) fn tiny(merges: &[&[u8]], pattern: &str) -> Value {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut vocab = Vec::new();
    for i in 0..256u32 {
        vocab.push(json!({"rank": i, "token_bytes": base64::Engine::encode(&b64, [i as u8])}));
    }
    for (i, m) in merges.iter().enumerate() {
        vocab.push(json!({"rank": 256 + i, "token_bytes": base64::Engine::encode(&b64, m)}));
    }
    json!({
        "config": {
            "pattern": pattern,
            "default_vocab_size": 20 + vocab.len(),
            "default_num_special_tokens": 20,
            "version": "v3",
        },
        "vocab": vocab,
    })
}

pub(super) fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}
