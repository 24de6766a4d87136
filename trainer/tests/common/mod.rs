//! What the integration tests share: the path of a fixture under `../shared`.

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
