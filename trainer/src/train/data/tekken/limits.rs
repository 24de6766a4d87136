//! The largest sizes and counts a tekken.json may declare. A tokenizer file comes from a hub
//! and is not trusted: every number in it that sizes an allocation or a loop is checked
//! against one of these before that allocation or loop, so a hostile or corrupt file is a
//! [`DataError::TokenizerLimit`] naming the field, never an out-of-memory abort.
//!
//! The values leave wide headroom over the real files (tekken_240911.json: 19 MB, 150 000
//! vocabulary entries, 131 072 default ids, 1 000 special tokens, tokens of at most 78 bytes,
//! a 250-byte pattern, 16 px patches up to 1024 px).

use super::super::error::{DataError, Result};
use std::path::Path;

/// File size: 256 MiB, 13x the real 19 MB file. The whole file is read and parsed in memory
/// (the parse borrows from it), so this bounds the read and every list parsed from it.
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// `default_num_special_tokens`: 2^16, 65x the real 1 000. Each special id gets a string (the
/// unlisted ones a `<SPECIAL_i>` filler), so the count is allocated before any token is read.
pub const MAX_SPECIAL_TOKENS: u64 = 1 << 16;

/// Vocabulary sizes (`default_vocab_size`, the requested size, the number of `vocab`
/// entries): 2^24, 128x the real 131 072 and beyond any published model's embedding. The
/// rank map and the offset table are reserved at this size.
pub const MAX_VOCAB: u64 = 1 << 24;

/// Bytes of one token: 4 KiB, 52x the real longest (78). The merge loop hashes a pair of
/// tokens per rank lookup, so this also bounds the work of one lookup.
pub const MAX_TOKEN_BYTES: u64 = 4 << 10;

/// The split pattern's length: 64 KiB, 260x the real pattern. fancy-regex compiles it once;
/// a huge pattern would only cost time and memory at load.
pub const MAX_PATTERN_BYTES: u64 = 64 << 10;

/// `image_patch_size`: 4 096 px, 256x the real 16. With [`MAX_MERGE`] it keeps
/// `patch_size * merge_size` (the side of one image token) far inside `u32`.
pub const MAX_PATCH: u64 = 1 << 12;

/// `spatial_merge_size`: 64, 32x Mistral3's 2.
pub const MAX_MERGE: u64 = 1 << 6;

/// `max_image_size`: 65 536 px, 64x the real 1024 (and past what an image decoder is asked to
/// handle in one side).
pub const MAX_IMAGE_SIDE: u64 = 1 << 16;

/// The limits a file is read under: [`Limits::DEFAULT`] always, except in tests, which shrink
/// them to reach each one with a small file.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    pub file_bytes: u64,
    pub special_tokens: u64,
    pub vocab: u64,
    pub token_bytes: u64,
    pub pattern_bytes: u64,
}

impl Limits {
    pub const DEFAULT: Limits = Limits {
        file_bytes: MAX_FILE_BYTES,
        special_tokens: MAX_SPECIAL_TOKENS,
        vocab: MAX_VOCAB,
        token_bytes: MAX_TOKEN_BYTES,
        pattern_bytes: MAX_PATTERN_BYTES,
    };
}

/// `value` of `field` must not exceed `limit`.
pub(super) fn check(path: &Path, field: &'static str, value: u64, limit: u64) -> Result<()> {
    if value > limit {
        return Err(DataError::TokenizerLimit {
            path: path.into(),
            field,
            value,
            limit,
        });
    }
    Ok(())
}

/// The number of bytes the base64 text `b64` decodes to (exact for valid padded base64, an
/// upper bound otherwise), computed before decoding so an oversized token is refused unread.
pub(super) fn base64_decoded_len(b64: &str) -> u64 {
    let pad = b64.bytes().rev().take(2).filter(|&c| c == b'=').count() as u64;
    (b64.len() as u64)
        .div_ceil(4)
        .saturating_mul(3)
        .saturating_sub(pad)
}
