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

/// SplitMix64: a seeded generator, so a failure names a case that can be replayed.
pub(super) struct Rng(pub u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub(super) fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
    /// Any Unicode scalar value, weighted toward the planes text uses.
    pub(super) fn char(&mut self) -> char {
        let hi = self.pick(&[0x80u32, 0x800, 0x3_0000, 0x11_0000]);
        loop {
            if let Some(c) = char::from_u32(self.next() as u32 % hi) {
                return c;
            }
        }
    }
}
