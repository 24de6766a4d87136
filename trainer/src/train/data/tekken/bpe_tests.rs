//! The heap merge against tiktoken's loop (kept here as the oracle) on many generated texts,
//! with the real tokenizer file at both vocabulary sizes the parity tests use.

use super::test_util::{real_path, Rng};
use super::Tekken;
use std::sync::OnceLock;

fn full() -> &'static Tekken {
    static T: OnceLock<Tekken> = OnceLock::new();
    T.get_or_init(|| Tekken::from_file(real_path(), None).unwrap())
}

fn small() -> &'static Tekken {
    static T: OnceLock<Tekken> = OnceLock::new();
    T.get_or_init(|| Tekken::from_file(real_path(), Some(8192)).unwrap())
}

/// tiktoken's `byte_pair_encode` as this crate ran it before the heap: after each merge, scan
/// every part for the lowest rank (strict `<`, so the leftmost of equal ranks wins).
fn oracle_bpe(tok: &Tekken, piece: &[u8], out: &mut Vec<u32>) {
    let ns = tok.num_special;
    if piece.is_empty() {
        return;
    }
    if let Some(&r) = tok.ranks.get(piece) {
        out.push(r + ns);
        return;
    }
    let rank_of = |a: usize, b: usize| tok.ranks.get(&piece[a..b]).copied().unwrap_or(u32::MAX);
    // parts[i] = (start byte of part i, rank of merging part i with part i+1)
    let mut parts: Vec<(usize, u32)> = Vec::new();
    let mut min = (u32::MAX, usize::MAX);
    for i in 0..piece.len() - 1 {
        let r = rank_of(i, i + 2);
        if r < min.0 {
            min = (r, i);
        }
        parts.push((i, r));
    }
    parts.push((piece.len() - 1, u32::MAX));
    parts.push((piece.len(), u32::MAX));
    let get = |parts: &[(usize, u32)], i: usize| {
        if i + 3 < parts.len() {
            rank_of(parts[i].0, parts[i + 3].0)
        } else {
            u32::MAX
        }
    };
    while min.0 != u32::MAX {
        let i = min.1;
        if i > 0 {
            parts[i - 1].1 = get(&parts, i - 1);
        }
        parts[i].1 = get(&parts, i);
        parts.remove(i + 1);
        min = (u32::MAX, usize::MAX);
        for (j, &(_, r)) in parts[..parts.len() - 1].iter().enumerate() {
            if r < min.0 {
                min = (r, j);
            }
        }
    }
    for w in parts.windows(2) {
        out.push(rank_of(w[0].0, w[1].0) + ns);
    }
}

/// `text` through the file's split and the oracle merge.
fn oracle_encode(tok: &Tekken, text: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for p in tok.pieces(text) {
        oracle_bpe(tok, p.as_bytes(), &mut out);
    }
    out
}

/// `bytes` merged as one piece, skipping the split: longer pieces than text ever makes, and
/// byte strings that are not UTF-8.
fn heap_piece(tok: &Tekken, bytes: &[u8]) -> Vec<u32> {
    let mut out = Vec::new();
    tok.bpe(bytes, &mut Default::default(), &mut out);
    out
}

fn oracle_piece(tok: &Tekken, bytes: &[u8]) -> Vec<u32> {
    let mut out = Vec::new();
    oracle_bpe(tok, bytes, &mut out);
    out
}

/// Characters of many scripts and of every class the split pattern tells apart, emoji with
/// their joiners and modifiers included.
const MIXED: &[&str] = &[
    "a",
    "e",
    "t",
    " ",
    "  ",
    "\n",
    "\t",
    "\r\n",
    "The",
    "ing",
    "é",
    "ß",
    "Ω",
    "ж",
    "Щ",
    "ع",
    "ש",
    "क",
    "ि",
    "中",
    "文",
    "ア",
    "한",
    "ไ",
    "0",
    "7",
    "٣",
    "½",
    ".",
    ",",
    "'",
    "!",
    "/",
    "-",
    "=",
    "_",
    "€",
    "\u{a0}",
    "\u{3000}",
    "\u{200d}",
    "\u{0301}",
    "🙂",
    "👍🏽",
    "👨‍👩‍👧",
    "🇫🇷",
    "❤️",
    "𝔘",
    "\u{0}",
    "\u{7f}",
    "\u{feff}",
];

/// A generated text of kind `kind` (cycled by the caller): random Unicode, mixed scripts, a
/// run of one letter or one short unit, or random ASCII.
fn text(rng: &mut Rng, kind: usize) -> String {
    let len = rng.below(200);
    match kind % 4 {
        0 => (0..len).map(|_| rng.char()).collect(),
        1 => (0..len).map(|_| rng.pick(MIXED)).collect(),
        2 => {
            let unit = rng.pick(&["a", "z", "e", "é", "中", " ", "=", "-", "0", "ab", "🙂"]);
            unit.repeat(1 + rng.below(600))
        }
        _ => (0..len)
            .map(|_| (b' ' + rng.below(95) as u8) as char)
            .collect(),
    }
}

#[test]
fn heap_merge_equals_the_oracle_on_generated_texts() {
    let mut rng = Rng(0x007e_6be7);
    for case in 0..600 {
        let s = text(&mut rng, case);
        for tok in [full(), small()] {
            assert_eq!(
                tok.encode(&s, false, false),
                oracle_encode(tok, &s),
                "case {case}: {s:?}"
            );
        }
    }
}

#[test]
fn heap_merge_equals_the_oracle_on_whole_byte_strings() {
    // Texts and raw bytes merged as one piece: no split shortens them, so merges chain far.
    let mut rng = Rng(0x000b_97e5);
    for case in 0..400 {
        let bytes: Vec<u8> = match case % 3 {
            0 => text(&mut rng, case / 3).into_bytes(),
            // A small alphabet so that many pairs are tokens.
            1 => (0..rng.below(300))
                .map(|_| rng.pick(b"ab e\xc3\xa9t"))
                .collect(),
            _ => (0..rng.below(300)).map(|_| rng.next() as u8).collect(),
        };
        for tok in [full(), small()] {
            assert_eq!(
                heap_piece(tok, &bytes),
                oracle_piece(tok, &bytes),
                "case {case}: {bytes:?}"
            );
        }
    }
}

#[test]
fn long_run_of_one_letter_tokenizes_like_the_oracle() {
    // The probe's case: 160 000 letters are one piece. The oracle is quadratic (seconds in a
    // release build, minutes here), so it checks shorter runs of the same letter.
    let tok = full();
    let long = "a".repeat(160_000);
    let ids = tok.encode(&long, false, false);
    assert_eq!(tok.decode(&ids).unwrap(), long);
    for n in [1, 2, 3, 100, 4_096, 5_000] {
        let s = "a".repeat(n);
        assert_eq!(
            tok.encode(&s, false, false),
            oracle_encode(tok, &s),
            "run of {n}"
        );
    }
}

/// Times the oracle and the heap: `cargo test --release -p cannon-trainer --lib
/// tekken::bpe_tests::time -- --ignored --nocapture`.
#[test]
#[ignore]
fn time_long_run_and_english() {
    let tok = full();
    let long = "a".repeat(160_000);
    let t = std::time::Instant::now();
    let a = oracle_encode(tok, &long);
    let oracle = t.elapsed();
    let t = std::time::Instant::now();
    let b = tok.encode(&long, false, false);
    let heap = t.elapsed();
    assert_eq!(a, b);
    println!("160k letters: oracle {oracle:?}, heap {heap:?}");
    let english = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/DESIGN.md"
    ))
    .unwrap();
    let english = english.repeat(20);
    let t = std::time::Instant::now();
    let a = oracle_encode(tok, &english);
    let oracle = t.elapsed();
    let t = std::time::Instant::now();
    let b = tok.encode(&english, false, false);
    let heap = t.elapsed();
    assert_eq!(a, b);
    println!(
        "{} bytes of English: oracle {oracle:?}, heap {heap:?}",
        english.len()
    );
}
