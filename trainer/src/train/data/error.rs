//! The one error type of the data pipeline. Every variant names what a user needs to find the
//! problem: the file, the line of a dataset, or the sample.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("tokenizer {path}: {reason}")]
    Tokenizer { path: PathBuf, reason: String },
    /// A size or count in a tokenizer file past what this reader accepts (see
    /// `tekken::limits`): refused before anything of that size is allocated.
    #[error("tokenizer {path}: {field} is {value}, over the limit of {limit}")]
    TokenizerLimit {
        path: PathBuf,
        field: &'static str,
        value: u64,
        limit: u64,
    },
    #[error("tokenizer split pattern: {0}")]
    Pattern(String),
    #[error("token id {id} is outside the vocabulary of {vocab_size}")]
    UnknownId { id: u32, vocab_size: u32 },
    #[error("image {path}: cannot decode: {source}")]
    Image {
        path: PathBuf,
        #[source]
        source: image::ImageError,
    },
    /// Found when a sample is loaded for a step: the image was decoded to another size than
    /// its header gave when the dataset was read (the file changed since).
    #[error(
        "image {path}: {found_w}x{found_h} after resizing where the dataset's index says \
         {want_w}x{want_h} (the file changed after the dataset was read)"
    )]
    ImageChanged {
        path: PathBuf,
        want_w: u32,
        want_h: u32,
        found_w: u32,
        found_h: u32,
    },
    #[error("image {path}: {width}x{height} is too small for one {min}x{min} image token")]
    ImageTooSmall {
        path: PathBuf,
        width: u32,
        height: u32,
        min: u32,
    },
    #[error("sample {sample}: {placeholders} <image> placeholder(s) but {images} image(s)")]
    PlaceholderMismatch {
        sample: String,
        placeholders: usize,
        images: usize,
    },
    #[error("sample {sample}: {reason}")]
    Sample { sample: String, reason: String },
    #[error("{path}:{line}: {reason}")]
    BadLine {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("{path} already exists: refusing to overwrite a dataset (force replaces it)")]
    Exists { path: PathBuf },
    /// A bad record's message read back from the index cache (the variant it had when the
    /// dataset was read is not kept, only what it said).
    #[error("{0}")]
    Recorded(String),
    #[error("invalid data config: {0}")]
    Config(String),
    /// The loaders of a run's ranks could not agree on a batch (see `Loader::next_rows`):
    /// the collective failed, or another rank failed to make its rows.
    #[error("ranks making a batch together: {0}")]
    Ranks(String),
    #[error(transparent)]
    Batch(#[from] crate::model::batch::BatchError),
}

pub type Result<T> = std::result::Result<T, DataError>;

impl DataError {
    /// Whether a sample whose image failed with this error while being loaded for a step is
    /// skipped (the file's contents are bad: truncated, corrupt, changed) rather than the step
    /// failing. A file that cannot be opened or read is not skipped: the dataset read it, so
    /// its going away is the machine's problem (a lost mount), not the data's.
    pub fn skippable_at_load(&self) -> bool {
        matches!(
            self,
            DataError::Image { .. } | DataError::ImageChanged { .. }
        )
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DataError::Io {
            path: path.into(),
            source,
        }
    }
}
