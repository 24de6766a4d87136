//! Each limit of [`super::limits`]: a file past it is refused with the field named, one at it
//! loads, and the real file loads under all of them.

use super::super::error::DataError;
use super::file;
use super::limits::{self, Limits};
use super::test_util::{bytes, real_path, tiny};
use super::Tekken;
use serde_json::{json, Value};
use std::path::Path;

const SIMPLE: &str = r"\S+|\s+";

fn load(v: &Value, vocab: Option<u32>) -> Result<Tekken, DataError> {
    Tekken::from_slice(&bytes(v), vocab, Path::new("crafted.json"))
}

fn load_with(v: &Value, lim: &Limits) -> Result<Tekken, DataError> {
    file::parse(&bytes(v), Path::new("crafted.json"), |d| d, lim)
}

/// The error must be the limit of `field` at `limit`, with the offending `value`.
fn assert_limit(r: Result<Tekken, DataError>, field: &str, value: u64, limit: u64) {
    match r {
        Err(DataError::TokenizerLimit {
            field: f,
            value: v,
            limit: l,
            ..
        }) => {
            assert_eq!((f, v, l), (field, value, limit));
        }
        Err(e) => panic!("want the {field} limit, got {e}"),
        Ok(_) => panic!("want the {field} limit, the file loaded"),
    }
}

#[test]
fn real_file_loads_under_the_limits() {
    let raw = std::fs::read(real_path()).unwrap();
    let v: Value = serde_json::from_slice(&raw).unwrap();
    let t = Tekken::from_file(real_path(), None).unwrap();
    let cfg = &v["config"];
    assert_eq!(
        t.vocab_size() as u64,
        cfg["default_vocab_size"].as_u64().unwrap()
    );
    assert_eq!(
        t.num_special_tokens() as u64,
        cfg["default_num_special_tokens"].as_u64().unwrap()
    );
}

#[test]
fn special_token_count_over_the_limit_is_refused_before_allocating() {
    let mut v = tiny(&[], SIMPLE);
    // The probe's case: 4e9 fillers would be made before any check.
    v["config"]["default_num_special_tokens"] = json!(4_000_000_000u64);
    assert_limit(
        load(&v, None),
        "config.default_num_special_tokens",
        4_000_000_000,
        limits::MAX_SPECIAL_TOKENS,
    );
    // Past u32 too: still the limit, not a JSON type error.
    v["config"]["default_num_special_tokens"] = json!(u64::MAX);
    assert_limit(
        load(&v, None),
        "config.default_num_special_tokens",
        u64::MAX,
        limits::MAX_SPECIAL_TOKENS,
    );
    // At the limit the file loads, with fillers for the unlisted ids.
    let n = limits::MAX_SPECIAL_TOKENS;
    v["config"]["default_num_special_tokens"] = json!(n);
    v["config"]["default_vocab_size"] = json!(n + 256);
    let t = load(&v, None).unwrap();
    assert_eq!(t.num_special_tokens() as u64, n);
    assert_eq!(
        t.special_str(n as u32 - 1),
        Some(format!("<SPECIAL_{}>", n - 1).as_str())
    );
}

#[test]
fn special_token_list_over_the_limit_is_refused() {
    let mut v = tiny(&[], SIMPLE);
    let list: Vec<Value> = (0..21)
        .map(|i| json!({"rank": i, "token_str": format!("<t{i}>")}))
        .collect();
    v["special_tokens"] = json!(list);
    let lim = Limits {
        special_tokens: 20,
        ..Limits::DEFAULT
    };
    assert_limit(load_with(&v, &lim), "number of special_tokens", 21, 20);
}

#[test]
fn vocab_sizes_over_the_limit_are_refused() {
    let mut v = tiny(&[], SIMPLE);
    v["config"]["default_vocab_size"] = json!(limits::MAX_VOCAB + 1);
    assert_limit(
        load(&v, None),
        "config.default_vocab_size",
        limits::MAX_VOCAB + 1,
        limits::MAX_VOCAB,
    );
    // The size asked for by a run is checked like the file's.
    let v = tiny(&[], SIMPLE);
    assert_limit(
        load(&v, Some(u32::MAX)),
        "vocab_size",
        u32::MAX as u64,
        limits::MAX_VOCAB,
    );
}

#[test]
fn vocab_entry_count_over_the_limit_is_refused() {
    // MAX_VOCAB entries would not fit under the file limit; a smaller limit reaches the check.
    // 257 entries, a default size of 256 and no specials: only the entry count is past 256.
    let mut v = tiny(&[b"ab"], SIMPLE);
    v["config"]["default_vocab_size"] = json!(256);
    v["config"]["default_num_special_tokens"] = json!(0);
    v["config"]["version"] = json!("v13");
    v["special_tokens"] = json!([]);
    let lim = |vocab| Limits {
        vocab,
        ..Limits::DEFAULT
    };
    assert_limit(
        load_with(&v, &lim(256)),
        "number of vocab entries",
        257,
        256,
    );
    assert_eq!(load_with(&v, &lim(257)).unwrap().vocab_size(), 256);
}

#[test]
fn token_over_the_limit_is_refused_unread() {
    let n = limits::MAX_TOKEN_BYTES as usize;
    let at = vec![b'x'; n];
    let over = vec![b'y'; n + 1];
    assert!(load(&tiny(&[&at], SIMPLE), None).is_ok());
    assert_limit(
        load(&tiny(&[&at, &over], SIMPLE), None),
        "token_bytes length",
        n as u64 + 1,
        limits::MAX_TOKEN_BYTES,
    );
}

#[test]
fn pattern_over_the_limit_is_refused() {
    let n = limits::MAX_PATTERN_BYTES as usize + 1;
    let long = "a".repeat(n);
    assert_limit(
        load(&tiny(&[], &long), None),
        "config.pattern length",
        n as u64,
        limits::MAX_PATTERN_BYTES,
    );
}

#[test]
fn image_sizes_are_bounded() {
    let mut v = tiny(&[], SIMPLE);
    v["image"] = json!({"image_patch_size": 16, "max_image_size": 1024});
    assert!(load(&v, None).is_ok());
    v["image"]["image_patch_size"] = json!(limits::MAX_PATCH + 1);
    assert_limit(
        load(&v, None),
        "image.image_patch_size",
        limits::MAX_PATCH + 1,
        limits::MAX_PATCH,
    );
    v["image"]["image_patch_size"] = json!(0);
    let e = load(&v, None).unwrap_err().to_string();
    assert!(e.contains("image.image_patch_size is 0"), "{e}");
    v["image"] = json!({"image_patch_size": 16, "max_image_size": 1024, "spatial_merge_size": 65});
    assert_limit(
        load(&v, None),
        "image.spatial_merge_size",
        65,
        limits::MAX_MERGE,
    );
    v["image"] = json!({"image_patch_size": 16, "max_image_size": limits::MAX_IMAGE_SIDE + 1});
    assert_limit(
        load(&v, None),
        "image.max_image_size",
        limits::MAX_IMAGE_SIDE + 1,
        limits::MAX_IMAGE_SIDE,
    );
}

#[test]
fn file_over_the_limit_is_refused_before_it_is_read() {
    // A sparse file: its size is checked from its metadata, so nothing is read or allocated.
    let dir = std::env::temp_dir().join(format!("cannon-tekken-limit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("huge.json");
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(limits::MAX_FILE_BYTES + 1).unwrap();
    drop(f);
    let r = Tekken::from_file(&p, None);
    std::fs::remove_dir_all(&dir).ok();
    assert_limit(
        r,
        "file size",
        limits::MAX_FILE_BYTES + 1,
        limits::MAX_FILE_BYTES,
    );
    // Bytes handed over directly are held to the same limit.
    let v = tiny(&[], SIMPLE);
    let n = bytes(&v).len() as u64;
    let lim = Limits {
        file_bytes: n - 1,
        ..Limits::DEFAULT
    };
    assert_limit(load_with(&v, &lim), "file size", n, n - 1);
}
