//! What can go wrong saving, finding, loading and exporting checkpoints.

use crate::model::error::ModelError;
use crate::model::st::StError;
use cannon_kernels::KernelError;
use cannon_runtime::comm::CommError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: bad checkpoint manifest: {reason}")]
    Manifest { path: PathBuf, reason: String },
    #[error(
        "{path}: checkpoint format version {found}; this build reads version {supported} \
         (written by a newer cannon?)"
    )]
    Version {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("{path}: bad shard file: {reason}")]
    Shard { path: PathBuf, reason: String },
    #[error(
        "no complete checkpoint in {0} (a complete one is a step-<N> directory with a \
         manifest.json; step-<N>.tmp directories are unfinished saves)"
    )]
    NoCheckpoint(PathBuf),
    #[error("the checkpoint does not fit: {0}")]
    Mismatch(String),
    #[error("bad argument: {0}")]
    Argument(String),
    #[error("{path} exists and is not empty (pass --force to replace an earlier export there)")]
    Exists { path: PathBuf },
    /// `--out` holds what an export does not write: never replaced, whatever `--force`.
    #[error(
        "{path} is not an earlier export (it holds {found}): not replacing it, even with \
         --force (it may be a run folder or someone's data); choose another --out"
    )]
    NotAnExport { path: PathBuf, found: String },
    /// `--out` and the checkpoint being read overlap: the export would write over its input.
    #[error(
        "--out {out} overlaps the checkpoint being read ({checkpoint}): export to a folder \
         outside it"
    )]
    OverlapsCheckpoint { out: PathBuf, checkpoint: PathBuf },
    /// The file system ran out of space while a save wrote: nothing was committed.
    #[error(
        "{path}: no space left on device while saving step {step}: the checkpoint was not \
         committed and the newest complete one stays the latest (free space, or lower \
         checkpoint.keep_last, then resume)"
    )]
    NoSpace {
        step: u64,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("another rank failed while saving step {step}; the checkpoint was not committed")]
    PeerFailed { step: u64 },
    /// A tensor about to be saved holds what no checkpoint should (a non-finite value, a
    /// weight past the run's bound): the save stops and nothing is committed.
    #[error(
        "step {step}: {tensor} {what}: the checkpoint was not written (the previous one stays \
         the latest)"
    )]
    Unsafe {
        step: u64,
        tensor: String,
        what: String,
    },
    /// A shard file's own read or write (same messages as the variants above).
    #[error(transparent)]
    St(#[from] StError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Comm(#[from] CommError),
    /// A fault injected by a test to stop a save half-way.
    #[cfg(test)]
    #[error("injected fault: {0}")]
    Injected(&'static str),
}

impl From<crate::durable::FsError> for CheckpointError {
    fn from(e: crate::durable::FsError) -> Self {
        CheckpointError::Io {
            path: e.path,
            source: e.source,
        }
    }
}

impl CheckpointError {
    /// A failed save's error, told as running out of space when that is what it was.
    pub(crate) fn of_save(self, step: u64) -> Self {
        let (path, source) = match self {
            CheckpointError::Io { path, source }
            | CheckpointError::St(StError::Io { path, source })
                if crate::durable::is_no_space(&source) =>
            {
                (path, source)
            }
            other => return other,
        };
        CheckpointError::NoSpace { step, path, source }
    }
}

impl From<cannon_runtime::Error> for CheckpointError {
    fn from(e: cannon_runtime::Error) -> Self {
        CheckpointError::Kernel(KernelError::Runtime(e))
    }
}

pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;

/// `map_err` helper: an I/O error with the path it happened on.
pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}
