//! The Tekken tokenizer (mistral-common `Tekkenizer`): tiktoken byte-level BPE over the ranks of
//! `tekken.json`, ids shifted by the number of special tokens.
//!
//! Parity: the same vocabulary cut as `Tekkenizer(vocab_size=)` (only the first
//! `vocab_size - num_special_tokens` ranks are mergeable), the same pre-tokenizer split, and
//! tiktoken's merge loop (lowest-rank adjacent pair first, leftmost on ties; a piece that is a
//! token as a whole is that token).

use super::error::{DataError, Result};
use super::pretok::{Pretokenizer, TEKKEN_PATTERN};
use base64::Engine;
use serde::Deserialize;
use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::{Path, PathBuf};

/// The 20 special tokens of tekken files that carry no `special_tokens` list (versions <= v7).
pub const DEFAULT_SPECIAL_TOKENS: [&str; 20] = [
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
];

/// FxHash (rustc's hasher): the rank map is hit once per piece and per merge step, and SipHash
/// would cost more than the merge itself. Keys come from the tokenizer file, not an adversary.
#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(K);
        }
    }
    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.0 = (self.0.rotate_left(5) ^ n as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

#[derive(Deserialize)]
struct FileConfig {
    pattern: String,
    default_vocab_size: u32,
    default_num_special_tokens: u32,
    #[serde(default)]
    version: Option<String>,
}

#[derive(Deserialize)]
struct FileVocab<'a> {
    rank: u32,
    #[serde(borrow)]
    token_bytes: Cow<'a, str>,
}

#[derive(Deserialize)]
struct FileSpecial {
    rank: u32,
    token_str: String,
}

/// The `image` section of tekken.json (mistral-common `ImageConfig`).
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct TekkenImage {
    pub image_patch_size: u32,
    pub max_image_size: u32,
    #[serde(default = "one")]
    pub spatial_merge_size: u32,
}

fn one() -> u32 {
    1
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

/// The tekken versions this reader knows: mistral-common's `TokenizerVersion`s that tekken
/// files carry. What changes between them for training data is read from the file itself
/// (the special-token list, the image section), not from the number.
pub const KNOWN_VERSIONS: [&str; 4] = ["v3", "v7", "v11", "v13"];

/// The number of a `vN` version string.
fn version_number(v: &str) -> Option<u32> {
    v.strip_prefix('v')?.parse().ok()
}

enum Splitter {
    /// The hand-written equivalent of [`TEKKEN_PATTERN`].
    Fast(Pretokenizer),
    /// Any other pattern.
    Regex(fancy_regex::Regex),
}

/// A loaded tekken tokenizer. `Sync`: encode from many threads at once.
pub struct Tekken {
    /// token bytes -> rank, for ranks < vocab_size - num_special.
    ranks: FxMap<Vec<u8>, u32>,
    /// rank -> token bytes, as offsets into `bytes`.
    offsets: Vec<u32>,
    bytes: Vec<u8>,
    specials: Vec<String>,
    special_ids: HashMap<String, u32>,
    num_special: u32,
    pattern: String,
    splitter: Splitter,
    image: Option<TekkenImage>,
    version: Option<String>,
    /// [`super::hash::hash64`] of the file's bytes.
    fingerprint: u64,
}

impl std::fmt::Debug for Tekken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tekken")
            .field("vocab_size", &self.vocab_size())
            .field("num_special", &self.num_special)
            .field("version", &self.version)
            .finish()
    }
}

impl Tekken {
    /// Loads `tekken.json`; `vocab_size` (None: the file's default) truncates the vocabulary.
    pub fn from_file(path: impl AsRef<Path>, vocab_size: Option<u32>) -> Result<Self> {
        let path = path.as_ref();
        let raw = std::fs::read(path).map_err(|e| DataError::io(path, e))?;
        Self::from_slice(&raw, vocab_size, path)
    }

    /// Loads `tekken.json` for a model of `model_vocab` ids: the file's default vocabulary,
    /// cut to the model's when the model's is smaller (a model whose embedding has more rows
    /// than the tokenizer has ids keeps the tokenizer whole).
    pub fn for_model(path: impl AsRef<Path>, model_vocab: u32) -> Result<Self> {
        let path = path.as_ref();
        let raw = std::fs::read(path).map_err(|e| DataError::io(path, e))?;
        Self::parse(&raw, path, |default| default.min(model_vocab))
    }

    /// Parses the bytes of a tekken.json; `path` is only used in error messages.
    pub fn from_slice(raw: &[u8], vocab_size: Option<u32>, path: &Path) -> Result<Self> {
        Self::parse(raw, path, |default| vocab_size.unwrap_or(default))
    }

    /// Parses a tekken.json; `pick` chooses the vocabulary size from the file's default.
    fn parse(raw: &[u8], path: &Path, pick: impl FnOnce(u32) -> u32) -> Result<Self> {
        let bad = |reason: String| DataError::Tokenizer {
            path: PathBuf::from(path),
            reason,
        };
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
        let num_special = file.config.default_num_special_tokens;
        let vocab_size = pick(file.config.default_vocab_size);
        if vocab_size > file.vocab.len() as u32 + num_special {
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
        offsets.push(0);
        for (i, v) in file.vocab.iter().take(inner as usize).enumerate() {
            if v.rank as usize != i {
                return Err(bad(format!("vocab entry {i} has rank {}", v.rank)));
            }
            let tok = engine
                .decode(v.token_bytes.as_bytes())
                .map_err(|e| bad(format!("vocab entry {i}: bad base64: {e}")))?;
            if i < 256 && tok != [i as u8] {
                return Err(bad(format!("rank {i} is not the single byte {i}")));
            }
            bytes.extend_from_slice(&tok);
            offsets.push(bytes.len() as u32);
            if ranks.insert(tok, i as u32).is_some() {
                return Err(bad(format!("vocab entry {i} duplicates an earlier token")));
            }
        }
        let mut specials: Vec<String> = match file.special_tokens {
            Some(list) => {
                let mut v = Vec::with_capacity(list.len());
                for (i, s) in list.into_iter().enumerate() {
                    if s.rank as usize != i {
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
        let mut special_ids = HashMap::new();
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
            fingerprint: super::hash::hash64(raw),
        })
    }

    /// A hash of the tokenizer file's bytes: what the dataset index cache keys a tokenizer by
    /// (with [`Tekken::vocab_size`], which the file alone does not decide).
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Total ids: specials + mergeable ranks (mistral-common `n_words`).
    pub fn vocab_size(&self) -> u32 {
        self.num_special + self.offsets.len() as u32 - 1
    }
    pub fn num_special_tokens(&self) -> u32 {
        self.num_special
    }
    pub fn pattern(&self) -> &str {
        &self.pattern
    }
    pub fn image_config(&self) -> Option<TekkenImage> {
        self.image
    }
    pub fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }
    /// Id of a special token by its string, e.g. `"[IMG]"`.
    pub fn special_id(&self, token: &str) -> Option<u32> {
        self.special_ids.get(token).copied()
    }
    /// The special token's string (`<SPECIAL_i>` fillers included), None for a normal id.
    pub fn special_str(&self, id: u32) -> Option<&str> {
        self.specials.get(id as usize).map(String::as_str)
    }

    /// Ids of `text` (no special tokens are ever produced from text), with optional BOS/EOS.
    pub fn encode(&self, text: &str, bos: bool, eos: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if bos {
            out.push(self.bos_id());
        }
        self.encode_into(text, &mut out);
        if eos {
            out.push(self.eos_id());
        }
        out
    }

    /// Appends the ids of `text` to `out`.
    pub fn encode_into(&self, text: &str, out: &mut Vec<u32>) {
        let mut parts: Vec<(usize, u32)> = Vec::new();
        match &self.splitter {
            Splitter::Fast(p) => p.for_each_piece(text, |piece| {
                self.bpe(piece.as_bytes(), &mut parts, out);
            }),
            Splitter::Regex(re) => {
                for m in re.find_iter(text) {
                    // A regex runtime error (backtrack limit) only arises on pathological
                    // input; those bytes are encoded unsplit rather than dropped.
                    match m {
                        Ok(m) => self.bpe(m.as_str().as_bytes(), &mut parts, out),
                        Err(_) => self.bpe(text.as_bytes(), &mut parts, out),
                    }
                }
            }
        }
    }

    /// The split of `text` into pieces by the file's pattern (for tests and tools).
    pub fn pieces<'t>(&self, text: &'t str) -> Vec<&'t str> {
        match &self.splitter {
            Splitter::Fast(p) => p.pieces(text),
            Splitter::Regex(re) => re
                .find_iter(text)
                .filter_map(|m| m.ok())
                .map(|m| m.as_str())
                .collect(),
        }
    }

    /// tiktoken's `byte_pair_encode` for one piece; `parts` is scratch space reused across calls.
    fn bpe(&self, piece: &[u8], parts: &mut Vec<(usize, u32)>, out: &mut Vec<u32>) {
        let ns = self.num_special;
        if piece.is_empty() {
            return;
        }
        if let Some(&r) = self.ranks.get(piece) {
            out.push(r + ns);
            return;
        }
        let rank_of =
            |a: usize, b: usize| self.ranks.get(&piece[a..b]).copied().unwrap_or(u32::MAX);
        // parts[i] = (start byte of part i, rank of merging part i with part i+1)
        parts.clear();
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
                parts[i - 1].1 = get(parts, i - 1);
            }
            parts[i].1 = get(parts, i);
            parts.remove(i + 1);
            min = (u32::MAX, usize::MAX);
            for (j, &(_, r)) in parts[..parts.len() - 1].iter().enumerate() {
                if r < min.0 {
                    min = (r, j);
                }
            }
        }
        for w in parts.windows(2) {
            // Single bytes are always ranks (checked at load), so every part has a rank.
            out.push(rank_of(w[0].0, w[1].0) + ns);
        }
    }

    /// The bytes of `ids`; special tokens are skipped, or spelled out when `keep_specials`.
    pub fn decode_bytes(&self, ids: &[u32], keep_specials: bool) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            if id < self.num_special {
                if keep_specials {
                    out.extend_from_slice(self.specials[id as usize].as_bytes());
                }
                continue;
            }
            let r = (id - self.num_special) as usize;
            if r + 1 >= self.offsets.len() {
                return Err(DataError::UnknownId {
                    id,
                    vocab_size: self.vocab_size(),
                });
            }
            out.extend_from_slice(
                &self.bytes[self.offsets[r] as usize..self.offsets[r + 1] as usize],
            );
        }
        Ok(out)
    }

    /// The text of `ids` (specials skipped); invalid UTF-8 is replaced like mistral-common does.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let b = self.decode_bytes(ids, false)?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }

    pub fn bos_id(&self) -> u32 {
        self.special_id("<s>").unwrap_or(1)
    }
    pub fn eos_id(&self) -> u32 {
        self.special_id("</s>").unwrap_or(2)
    }
    pub fn pad_id(&self) -> u32 {
        self.special_id("<pad>").unwrap_or(11)
    }
}
