//! The safetensors format's element types, a tensor's description in a header, and what can go
//! wrong reading or writing a file.

use std::path::{Path, PathBuf};

/// What can go wrong reading or writing a safetensors file. The messages are those a
/// checkpoint reports for its shard files ([`crate::model::WeightsError`] and the train tier's
/// checkpoint error wrap these).
#[derive(Debug, thiserror::Error)]
pub enum StError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: bad shard file: {reason}")]
    Shard { path: PathBuf, reason: String },
    #[error("bad argument: {0}")]
    Argument(String),
}

pub type Result<T, E = StError> = std::result::Result<T, E>;

/// `map_err` helper: an I/O error with the path it happened on.
pub(super) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StError + '_ {
    move |source| StError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The element types written here: f32 (checkpoints, f32 exports) and bf16 (bf16 exports);
/// f16 too, which HF checkpoints may hold (read and widened like bf16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StDtype {
    F32,
    Bf16,
    F16,
}

impl StDtype {
    pub fn size(self) -> usize {
        match self {
            StDtype::F32 => 4,
            StDtype::Bf16 | StDtype::F16 => 2,
        }
    }

    /// The header's spelling.
    pub fn name(self) -> &'static str {
        match self {
            StDtype::F32 => "F32",
            StDtype::Bf16 => "BF16",
            StDtype::F16 => "F16",
        }
    }

    pub(super) fn parse(s: &str) -> Option<Self> {
        match s {
            "F32" => Some(StDtype::F32),
            "BF16" => Some(StDtype::Bf16),
            "F16" => Some(StDtype::F16),
            _ => None,
        }
    }
}

/// One tensor of a file being written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: StDtype,
    pub shape: Vec<usize>,
}

impl TensorSpec {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn bytes(&self) -> u64 {
        (self.numel() * self.dtype.size()) as u64
    }
}

/// Headers larger than this are not safetensors headers (the crate's own limit is 100 MB).
pub(super) const MAX_HEADER: u64 = 100_000_000;
