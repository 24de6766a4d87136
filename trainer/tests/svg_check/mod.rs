//! The SVG check the chart tests share (`plot.rs`, `plot_trace.rs`): an SVG written by
//! `cannon plot` must open in any viewer, and a browser refuses a malformed one outright.

/// A minimal well-formedness check: one root `<svg>`, every element closed in order, no
/// bare `&` or `<` in text, and nothing after the root.
pub fn assert_well_formed(svg: &str) {
    let body = svg.trim();
    let body = match body.strip_prefix("<?xml") {
        Some(rest) => &rest[rest.find("?>").expect("unterminated XML declaration") + 2..],
        None => body,
    }
    .trim();
    assert!(body.starts_with("<svg"), "no <svg> root: {}", &body[..40]);
    let mut stack: Vec<&str> = Vec::new();
    let mut rest = body;
    let mut closed_root = false;
    while let Some(open) = rest.find('<') {
        let text = &rest[..open];
        assert!(
            !closed_root || text.trim().is_empty(),
            "content after </svg>"
        );
        for (i, _) in text.match_indices('&') {
            let entity = &text[i..text[i..].find(';').map_or(text.len(), |e| i + e + 1)];
            assert!(
                ["&lt;", "&gt;", "&amp;", "&quot;", "&apos;"].contains(&entity)
                    || entity.starts_with("&#"),
                "bare & in text: {text}"
            );
        }
        let close = rest[open..].find('>').expect("unterminated tag") + open;
        let tag = &rest[open + 1..close];
        assert!(!tag.contains('<'), "`<` inside a tag: {tag}");
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop(), Some(name.trim()), "mismatched </{name}>");
            closed_root = stack.is_empty();
        } else if !tag.ends_with('/') && !tag.starts_with('!') {
            assert!(!closed_root, "a second root element: <{tag}>");
            stack.push(tag.split_whitespace().next().unwrap());
        }
        rest = &rest[close + 1..];
    }
    assert!(stack.is_empty(), "unclosed elements: {stack:?}");
    assert!(closed_root, "no closed root");
}
