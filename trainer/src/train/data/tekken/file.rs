//! Reading tekken.json: the file's layout, and its checks (versions, ranks, limits) before a
//! [`Tekken`] is built from it.

use super::super::error::{DataError, Result};
use super::super::pretok::{Pretokenizer, TEKKEN_PATTERN};
use super::fx::FxMap;
use super::limits::{self, check, Limits};
use super::{Splitter, Tekken, TekkenImage, DEFAULT_SPECIAL_TOKENS, KNOWN_VERSIONS};
use base64::Engine;
use serde::Deserialize;
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Sizes are read as u64 so that any value, even one past u32, is refused by its limit with
/// the field's name rather than as a JSON type error.
#[derive(Deserialize)]
struct FileConfig {
    pattern: String,
    default_vocab_size: u64,
    default_num_special_tokens: u64,
    #[serde(default)]
    version: Option<String>,
}

#[derive(Deserialize)]
struct FileVocab<'a> {
    rank: u64,
    #[serde(borrow)]
    token_bytes: Cow<'a, str>,
}

#[derive(Deserialize)]
struct FileSpecial {
    rank: u64,
    token_str: String,
}

#[derive(Deserialize)]
struct File<'a> {
    config: FileConfig,
    #[serde(borrow)]
    vocab: Vec<FileVocab<'a>>,
    #[serde(default)]
    special_tokens: Option<Vec<FileSpecial>>,
    #[serde(default)]
    image: Option<TekkenImage>,
    /// The image section's name up to v11 (mistral-common still reads it there).
    #[serde(default)]
    multimodal: Option<TekkenImage>,
}

/// The number of a `vN` version string.
fn version_number(v: &str) -> Option<u32> {
    v.strip_prefix('v')?.parse().ok()
}

/// The bytes of the file at `path`, refused past [`lim.file_bytes`] before it is read
/// (and while it is read, should it grow in between).
pub(super) fn read(path: &Path, lim: &Limits) -> Result<Vec<u8>> {
    let io = |e| DataError::io(path, e);
    let f = std::fs::File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    check(path, "file size", len, lim.file_bytes)?;
    let mut raw = Vec::with_capacity(len as usize);
    f.take(lim.file_bytes + 1)
        .read_to_end(&mut raw)
        .map_err(io)?;
    check(path, "file size", raw.len() as u64, lim.file_bytes)?;
    Ok(raw)
}

/// Parses a tekken.json; `pick` chooses the vocabulary size from the file's default.
pub(super) fn parse(
    raw: &[u8],
    path: &Path,
    pick: impl FnOnce(u32) -> u32,
    lim: &Limits,
) -> Result<Tekken> {
    let bad = |reason: String| DataError::Tokenizer {
        path: PathBuf::from(path),
        reason,
    };
    // The parse allocates in proportion to the text (each vocab entry borrows its base64).
    check(path, "file size", raw.len() as u64, lim.file_bytes)?;
    let file: File = serde_json::from_slice(raw).map_err(|source| DataError::Json {
        path: path.into(),
        source,
    })?;
    // A file without a version predates them (the first tekken files were v3).
    let version = file.config.version.as_deref().unwrap_or("v3");
    if !KNOWN_VERSIONS.contains(&version) {
        return Err(bad(format!(
            "version {version:?} is not one this build reads ({}); a newer file may \
             encode conversations differently",
            KNOWN_VERSIONS.join(", ")
        )));
    }
    let number = version_number(version).unwrap_or(3);
    if number > 7 && file.special_tokens.is_none() {
        return Err(bad(format!(
            "a {version} file must list its special_tokens (only files up to v7 may rely on \
             the 20 defaults)"
        )));
    }
    let image = match (file.image, file.multimodal) {
        (Some(i), _) => Some(i),
        (None, Some(_)) if number > 11 => {
            return Err(bad(format!(
                "a {version} file must call its image section `image`, not `multimodal`"
            )))
        }
        (None, m) => m,
    };
    if let Some(i) = &image {
        check_image(i, path)?;
    }
    let cfg = &file.config;
    check(
        path,
        "config.pattern length",
        cfg.pattern.len() as u64,
        lim.pattern_bytes,
    )?;
    check(
        path,
        "config.default_num_special_tokens",
        cfg.default_num_special_tokens,
        lim.special_tokens,
    )?;
    check(
        path,
        "config.default_vocab_size",
        cfg.default_vocab_size,
        lim.vocab,
    )?;
    check(
        path,
        "number of vocab entries",
        file.vocab.len() as u64,
        lim.vocab,
    )?;
    if let Some(list) = &file.special_tokens {
        check(
            path,
            "number of special_tokens",
            list.len() as u64,
            lim.special_tokens,
        )?;
    }
    // Both were checked against limits far below u32::MAX.
    let num_special = cfg.default_num_special_tokens as u32;
    let vocab_size = pick(cfg.default_vocab_size as u32);
    check(path, "vocab_size", vocab_size as u64, lim.vocab)?;
    let available = file.vocab.len() as u64 + num_special as u64;
    if vocab_size as u64 > available {
        return Err(bad(format!(
            "vocab_size {vocab_size} exceeds {} tokens + {num_special} specials",
            file.vocab.len()
        )));
    }
    // Every byte must stay encodable: the 256 single-byte ranks come first.
    let inner = vocab_size.checked_sub(num_special).filter(|&n| n >= 256);
    let Some(inner) = inner else {
        return Err(bad(format!(
            "vocab_size {vocab_size} leaves fewer than 256 byte tokens after {num_special} specials"
        )));
    };
    let engine = base64::engine::general_purpose::STANDARD;
    let mut ranks: FxMap<Vec<u8>, u32> = FxMap::default();
    ranks.reserve(inner as usize);
    let mut offsets = Vec::with_capacity(inner as usize + 1);
    let mut bytes = Vec::new();
    offsets.push(0u32);
    for (i, v) in file.vocab.iter().take(inner as usize).enumerate() {
        if v.rank != i as u64 {
            return Err(bad(format!("vocab entry {i} has rank {}", v.rank)));
        }
        check(
            path,
            "token_bytes length",
            limits::base64_decoded_len(&v.token_bytes),
            lim.token_bytes,
        )?;
        let tok = engine
            .decode(v.token_bytes.as_bytes())
            .map_err(|e| bad(format!("vocab entry {i}: bad base64: {e}")))?;
        if i < 256 && tok != [i as u8] {
            return Err(bad(format!("rank {i} is not the single byte {i}")));
        }
        bytes.extend_from_slice(&tok);
        // The file limit keeps the total far below u32::MAX; checked all the same, since an
        // offset that wrapped would hand out another token's bytes.
        let end = u32::try_from(bytes.len())
            .map_err(|_| bad("token bytes total more than 4 GiB".into()))?;
        offsets.push(end);
        if ranks.insert(tok, i as u32).is_some() {
            return Err(bad(format!("vocab entry {i} duplicates an earlier token")));
        }
    }
    let mut specials: Vec<String> = match file.special_tokens {
        Some(list) => {
            let mut v = Vec::with_capacity(list.len());
            for (i, s) in list.into_iter().enumerate() {
                if s.rank != i as u64 {
                    return Err(bad(format!("special token {i} has rank {}", s.rank)));
                }
                v.push(s.token_str);
            }
            v
        }
        None => DEFAULT_SPECIAL_TOKENS
            .iter()
            .map(|s| s.to_string())
            .collect(),
    };
    if specials.len() > num_special as usize {
        return Err(bad(format!(
            "{} special tokens but num_special_tokens is {num_special}",
            specials.len()
        )));
    }
    for i in specials.len()..num_special as usize {
        specials.push(format!("<SPECIAL_{i}>"));
    }
    let mut special_ids = HashMap::with_capacity(specials.len());
    for (i, s) in specials.iter().enumerate() {
        if special_ids.insert(s.clone(), i as u32).is_some() {
            return Err(bad(format!("special token {s} appears twice")));
        }
    }
    let pattern = file.config.pattern;
    let splitter = if pattern == TEKKEN_PATTERN {
        Splitter::Fast(Pretokenizer::new().map_err(DataError::Pattern)?)
    } else {
        Splitter::Regex(
            fancy_regex::Regex::new(&pattern).map_err(|e| DataError::Pattern(e.to_string()))?,
        )
    };
    Ok(Tekken {
        ranks,
        offsets,
        bytes,
        specials,
        special_ids,
        num_special,
        pattern,
        splitter,
        image,
        version: file.config.version,
        fingerprint: super::super::hash::hash64(raw),
    })
}

/// The image section's sizes: at least 1 (a zero patch divides by zero when an image is
/// cut), at most their limits (their product sizes the image grid).
fn check_image(i: &TekkenImage, path: &Path) -> Result<()> {
    for (field, value, limit) in [
        (
            "image.image_patch_size",
            i.image_patch_size,
            limits::MAX_PATCH,
        ),
        (
            "image.spatial_merge_size",
            i.spatial_merge_size,
            limits::MAX_MERGE,
        ),
        (
            "image.max_image_size",
            i.max_image_size,
            limits::MAX_IMAGE_SIDE,
        ),
    ] {
        if value == 0 {
            return Err(DataError::Tokenizer {
                path: path.into(),
                reason: format!("{field} is 0 (an image size must be at least 1)"),
            });
        }
        check(path, field, value as u64, limit)?;
    }
    Ok(())
}
