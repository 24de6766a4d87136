//! Tekken tokenizer parity with mistral-common on the shared reference encodings, round trips
//! on random Unicode, and piece-for-piece equality of the hand-written pre-tokenizer with
//! fancy-regex running the file's pattern.

mod common;
use common::shared_path;

use cannon_trainer::train::data::pretok::{Pretokenizer, TEKKEN_PATTERN};
use cannon_trainer::train::data::Tekken;
use proptest::prelude::*;
use std::sync::OnceLock;

fn tekken_json() -> std::path::PathBuf {
    shared_path("tokenizers/tekken_240911.json")
}

fn full() -> &'static Tekken {
    static T: OnceLock<Tekken> = OnceLock::new();
    T.get_or_init(|| Tekken::from_file(tekken_json(), None).unwrap())
}

fn small() -> &'static Tekken {
    static T: OnceLock<Tekken> = OnceLock::new();
    T.get_or_init(|| Tekken::from_file(tekken_json(), Some(8192)).unwrap())
}

/// Every case of a reference file (made by make_tekken_reference.py with mistral-common)
/// must give exactly the reference ids.
fn check_reference(tok: &Tekken, file: &str) {
    let raw = std::fs::read_to_string(shared_path(&format!("tokenizers/{file}"))).unwrap();
    let v: serde_json::Value = serde_json::from_str(&raw).unwrap();
    let meta = &v["meta"];
    assert_eq!(
        meta["vocab_size"].as_u64().unwrap(),
        tok.vocab_size() as u64
    );
    assert_eq!(
        meta["num_special_tokens"].as_u64().unwrap(),
        tok.num_special_tokens() as u64
    );
    assert_eq!(meta["bos_id"].as_u64().unwrap(), tok.bos_id() as u64);
    assert_eq!(meta["eos_id"].as_u64().unwrap(), tok.eos_id() as u64);
    let cases = v["cases"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for case in cases {
        let bos = case["bos"].as_bool().unwrap_or(false);
        let eos = case["eos"].as_bool().unwrap_or(false);
        let mut text = case["text"].as_str().unwrap();
        // The generator marks its BOS/EOS case by this prefix on the text it encoded.
        if bos || eos {
            text = text.strip_prefix("<bos+eos>").unwrap();
        }
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let got = tok.encode(text, bos, eos);
        assert_eq!(got, want, "{file}: {text:?}");
        assert_eq!(tok.decode(&got).unwrap(), text, "{file}: decode {text:?}");
    }
}

#[test]
fn tekken_matches_mistral_common_full_vocab() {
    check_reference(full(), "tekken_240911.reference.json");
}

#[test]
fn tekken_matches_mistral_common_vocab_8192() {
    check_reference(small(), "tekken_240911.v8192.reference.json");
}

/// 400 random Unicode strings (every class of the split pattern, any code point) and 20 chunks
/// of English, encoded by mistral-common 1.13.1 with both vocabularies
/// (tests/fixtures/data/make_tekken_random.py): exact equality on every one.
#[test]
fn tekken_matches_mistral_common_on_random_text() {
    let raw = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/data/tekken_random.jsonl"
    ))
    .unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let mut n = 0;
    for line in raw.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let text = v["text"].as_str().unwrap();
        assert_eq!(
            full().encode(text, false, false),
            ids(&v["full"]),
            "{text:?}"
        );
        assert_eq!(
            small().encode(text, false, false),
            ids(&v["v8192"]),
            "{text:?}"
        );
        n += 1;
    }
    assert_eq!(n, 420);
}

#[test]
fn tekken_special_tokens_are_the_documented_defaults() {
    let t = full();
    for (s, id) in [
        ("<unk>", 0),
        ("<s>", 1),
        ("</s>", 2),
        ("[INST]", 3),
        ("[/INST]", 4),
    ] {
        assert_eq!(t.special_id(s), Some(id), "{s}");
    }
    for (s, id) in [
        ("[IMG]", 10),
        ("<pad>", 11),
        ("[IMG_BREAK]", 12),
        ("[IMG_END]", 13),
    ] {
        assert_eq!(t.special_id(s), Some(id), "{s}");
    }
    assert_eq!(t.special_id("[SYSTEM_PROMPT]"), Some(17));
    assert_eq!(t.special_str(999), Some("<SPECIAL_999>"));
    // Special ids decode to nothing unless asked for.
    assert_eq!(t.decode(&[1, 3]).unwrap(), "");
    assert_eq!(t.decode_bytes(&[3], true).unwrap(), b"[INST]");
    assert!(t.decode(&[t.vocab_size()]).is_err());
}

#[test]
fn tekken_rejects_a_vocab_without_all_bytes() {
    let e = Tekken::from_file(tekken_json(), Some(1100)).unwrap_err();
    assert!(e.to_string().contains("256 byte tokens"), "{e}");
    let e = Tekken::from_file(tekken_json(), Some(10_000_000)).unwrap_err();
    assert!(e.to_string().contains("exceeds"), "{e}");
}

/// Random text drawn from characters of every class the split pattern distinguishes, so that
/// all alternatives and their backtracking paths are exercised.
fn tricky_text() -> impl Strategy<Value = String> {
    let pool: Vec<char> = vec![
        'a', 'z', 'A', 'Z', 'é', 'É', 'ß', 'ǅ', 'ʰ', '中', 'ア', 'א', '\u{0301}', '\u{0308}',
        '\u{20DD}', '0', '9', '٣', 'Ⅻ', '½', ' ', ' ', '\t', '\n', '\r', '\u{a0}', '\u{2028}',
        '\u{3000}', '/', '.', ',', '\'', '!', '-', '_', '🙂', '€', '\u{0}', '\u{7f}', '\u{ad}',
        '\u{200d}', 'ｘ', 'Ω', 'ω', 'ǈ', 'ᾈ',
    ];
    proptest::collection::vec(
        prop_oneof![
            3 => proptest::sample::select(pool),
            1 => any::<char>(),
        ],
        0..40,
    )
    .prop_map(|v| v.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn pretokenizer_equals_fancy_regex(s in tricky_text()) {
        static P: OnceLock<(Pretokenizer, fancy_regex::Regex)> = OnceLock::new();
        let (p, re) = P.get_or_init(|| {
            (Pretokenizer::new().unwrap(), fancy_regex::Regex::new(TEKKEN_PATTERN).unwrap())
        });
        let want: Vec<&str> = re.find_iter(&s).map(|m| m.unwrap().as_str()).collect();
        prop_assert_eq!(p.pieces(&s), want);
    }

    #[test]
    fn tekken_round_trips_random_unicode(s in "\\PC*|[\\s\\S]{0,64}", t in tricky_text()) {
        for tok in [full(), small()] {
            for text in [&s, &t] {
                let ids = tok.encode(text, false, false);
                prop_assert_eq!(&tok.decode(&ids).unwrap(), text);
            }
        }
    }
}
