//! Where the built-in defaults find their files: the project's shared folder (the default
//! tokenizer) and the cache folder of generated data.

use super::ConfigError;
use std::path::{Path, PathBuf};

/// Where the built-in defaults look for the project's shared folder: `../shared` of the
/// working directory (a checkout run from its root), then of the source tree this binary was
/// built from.
pub fn shared_candidates() -> Vec<PathBuf> {
    vec![
        PathBuf::from("../shared"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared"),
    ]
}

/// The Tekken file of the project's shared folder.
pub const SHARED_TOKENIZER: &str = "tokenizers/tekken_240911.json";

/// The default tokenizer: the first `<shared>/tokenizers/tekken_240911.json` that exists, or
/// an error listing where it looked.
pub fn default_tokenizer() -> Result<PathBuf, ConfigError> {
    let tried: Vec<PathBuf> = shared_candidates()
        .into_iter()
        .map(|s| s.join(SHARED_TOKENIZER))
        .collect();
    if let Some(p) = tried.iter().find(|p| p.is_file()) {
        return Ok(p.clone());
    }
    let list: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
    Err(ConfigError::Invalid {
        key: "data.tokenizer",
        value: "(default)".into(),
        reason: format!(
            "the built-in default uses the Tekken tokenizer of the project's shared folder \
             (../shared beside the checkout), which is missing: looked for {}. Set \
             data.tokenizer to a tekken.json",
            list.join(" and ")
        ),
    })
}

/// Whether `path` is the project's shared tokenizer (the same file as one of the
/// [`shared_candidates`]' `tokenizers/tekken_240911.json`).
pub fn is_shared_tokenizer(path: &Path) -> bool {
    let Ok(p) = std::fs::canonicalize(path) else {
        return false;
    };
    shared_candidates()
        .into_iter()
        .filter_map(|s| std::fs::canonicalize(s.join(SHARED_TOKENIZER)).ok())
        .any(|s| s == p)
}

/// The cache folder of generated data: `$CANNON_CACHE`, else `$XDG_CACHE_HOME/cannon`, else
/// `~/.cache/cannon`, else `./.cannon-cache`.
pub fn cache_dir() -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(p) = var("CANNON_CACHE") {
        return p;
    }
    if let Some(p) = var("XDG_CACHE_HOME") {
        return p.join("cannon");
    }
    if let Some(p) = var("HOME") {
        return p.join(".cache").join("cannon");
    }
    PathBuf::from(".cannon-cache")
}
