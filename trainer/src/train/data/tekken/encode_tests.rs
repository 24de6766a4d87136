//! Encoding whole texts: the regex split's error path, and encode-decode round trips.

use super::test_util::{bytes, real_path, tiny, Rng};
use super::Tekken;
use std::path::Path;

/// A pattern fancy-regex gives up on (backtrack limit) at a long `abab...` not followed by
/// `c`: each `ab` parses two ways, so the group has 2^n parses to try.
const BACKTRACKING: &str = r"(a|b|ab)*(?=c)|\S|\s";

#[test]
fn regex_error_fallback_emits_the_text_once() {
    let file = bytes(&tiny(&[b"ab", b"hi"], BACKTRACKING));
    let tok = Tekken::from_slice(&file, None, Path::new("backtracking.json")).unwrap();
    let text = format!("hi {}d c", "ab".repeat(40));
    // The case reaches the error path: pieces first, then the error.
    let re = fancy_regex::Regex::new(BACKTRACKING).unwrap();
    let found: Vec<_> = re.find_iter(&text).collect();
    assert!(found[0].is_ok(), "{found:?}");
    assert!(
        found.iter().any(|m| m.is_err()),
        "no regex error: {found:?}"
    );
    // Each byte is encoded once: the pieces before the error are not repeated, and the rest
    // of the text is not dropped.
    assert_eq!(tok.pieces(&text).concat(), text);
    let ids = tok.encode(&text, false, false);
    assert_eq!(tok.decode(&ids).unwrap(), text);
}

/// Tekken is byte-level: every byte is a token (ranks 0..256, checked at load) and the split
/// covers every character, so decode(encode(s)) is s for any Unicode string, at any
/// vocabulary size. Specials are never made from text, so none is lost in decoding.
#[test]
fn encode_then_decode_returns_any_unicode_text() {
    let full = Tekken::from_file(real_path(), None).unwrap();
    let small = Tekken::from_file(real_path(), Some(8192)).unwrap();
    // The same through the regex split (a simple pattern, so no backtracking error).
    let file = bytes(&tiny(
        &[b"ab", b"\xc3\xa9"],
        r"\p{L}+|\p{N}|\s+|[^\s\p{L}\p{N}]+",
    ));
    let regex = Tekken::from_slice(&file, None, Path::new("regex.json")).unwrap();
    let mut rng = Rng(0x5eed_0f7e);
    for case in 0..300 {
        let len = rng.below(if case % 10 == 0 { 2_000 } else { 80 });
        let text: String = (0..len)
            .map(|_| match rng.below(4) {
                // Any scalar value: all planes, private use, unassigned, controls, NUL.
                0 => loop {
                    if let Some(c) = char::from_u32(rng.below(0x11_0000) as u32) {
                        break c;
                    }
                },
                1 => ' ',
                _ => rng.char(),
            })
            .collect();
        for tok in [&full, &small, &regex] {
            let ids = tok.encode(&text, false, false);
            assert!(
                ids.iter().all(|&id| id >= tok.num_special_tokens()),
                "case {case}"
            );
            assert_eq!(
                tok.decode_bytes(&ids, true).unwrap(),
                text.as_bytes(),
                "case {case}"
            );
            assert_eq!(tok.decode(&ids).unwrap(), text, "case {case}");
        }
    }
}
