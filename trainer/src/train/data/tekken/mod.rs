//! The Tekken tokenizer (mistral-common `Tekkenizer`): tiktoken byte-level BPE over the ranks of
//! `tekken.json`, ids shifted by the number of special tokens.
//!
//! Parity: the same vocabulary cut as `Tekkenizer(vocab_size=)` (only the first
//! `vocab_size - num_special_tokens` ranks are mergeable), the same pre-tokenizer split, and
//! tiktoken's merge order (lowest-rank adjacent pair first, leftmost on ties; a piece that is a
//! token as a whole is that token), run in O(n log n) (see `bpe.rs`).

mod bpe;
#[cfg(test)]
mod bpe_tests;
#[cfg(test)]
mod encode_tests;
mod file;
mod fx;
#[cfg(test)]
mod limit_tests;
pub mod limits;
#[cfg(test)]
mod test_util;

use super::error::{DataError, Result};
use super::pretok::Pretokenizer;
use fx::FxMap;
use limits::Limits;
use serde::Deserialize;
use std::collections::HashMap;
use std::path::Path;

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

/// The tekken versions this reader knows: mistral-common's `TokenizerVersion`s that tekken
/// files carry. What changes between them for training data is read from the file itself
/// (the special-token list, the image section), not from the number.
pub const KNOWN_VERSIONS: [&str; 4] = ["v3", "v7", "v11", "v13"];

enum Splitter {
    /// The hand-written equivalent of [`super::pretok::TEKKEN_PATTERN`].
    Fast(Pretokenizer),
    /// Any other pattern.
    Regex(fancy_regex::Regex),
}

impl Splitter {
    /// Calls `f` on each piece of `text`, in order.
    fn for_each_piece<'t>(&self, text: &'t str, mut f: impl FnMut(&'t str)) {
        match self {
            Splitter::Fast(p) => p.for_each_piece(text, f),
            Splitter::Regex(re) => {
                let mut end = 0;
                for m in re.find_iter(text) {
                    match m {
                        Ok(m) => {
                            f(m.as_str());
                            end = m.end();
                        }
                        // A regex runtime error (backtrack limit) only arises on pathological
                        // input, and fancy-regex stops at it: the rest of the text, from the
                        // end of the last piece, is one piece rather than dropped (and the
                        // pieces before it are not repeated).
                        Err(_) => {
                            if end < text.len() {
                                f(&text[end..]);
                            }
                            break;
                        }
                    }
                }
            }
        }
    }
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
        let raw = file::read(path, &Limits::DEFAULT)?;
        Self::from_slice(&raw, vocab_size, path)
    }

    /// Loads `tekken.json` for a model of `model_vocab` ids: the file's default vocabulary,
    /// cut to the model's when the model's is smaller (a model whose embedding has more rows
    /// than the tokenizer has ids keeps the tokenizer whole).
    pub fn for_model(path: impl AsRef<Path>, model_vocab: u32) -> Result<Self> {
        let path = path.as_ref();
        let raw = file::read(path, &Limits::DEFAULT)?;
        file::parse(
            &raw,
            path,
            |default| default.min(model_vocab),
            &Limits::DEFAULT,
        )
    }

    /// Parses the bytes of a tekken.json; `path` is only used in error messages.
    pub fn from_slice(raw: &[u8], vocab_size: Option<u32>, path: &Path) -> Result<Self> {
        file::parse(
            raw,
            path,
            |default| vocab_size.unwrap_or(default),
            &Limits::DEFAULT,
        )
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
        let mut scratch = bpe::Scratch::default();
        self.splitter.for_each_piece(text, |piece| {
            self.bpe(piece.as_bytes(), &mut scratch, out);
        });
    }

    /// The split of `text` into pieces by the file's pattern (for tests and tools).
    pub fn pieces<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut v = Vec::new();
        self.splitter.for_each_piece(text, |p| v.push(p));
        v
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
