//! Encoding whole texts: the regex split's error path, and encode-decode round trips.

use super::test_util::{bytes, tiny};
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
