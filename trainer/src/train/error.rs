//! How a training run fails: [`TrainError`], with the helper that names the path of a
//! failed I/O call. Its own module so the run's plan, setup and loop all use it without
//! using each other.

use super::digest::DigestError;
use crate::config::ConfigError;
use crate::data::DataError;
use crate::eval::EvalError;
use crate::model::ModelError;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("data: {0}")]
    Data(#[from] DataError),
    #[error("model: {0}")]
    Model(#[from] ModelError),
    #[error(transparent)]
    Eval(#[from] EvalError),
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Input(String),
}

pub(super) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A refused context-parallel layout is the model's bad input, as it reads.
impl From<crate::cp::CpError> for TrainError {
    fn from(e: crate::cp::CpError) -> Self {
        crate::model::ModelError::from(e).into()
    }
}

/// An input file that could not be digested (for `run_identity.json`) is an I/O error on it.
impl From<DigestError> for TrainError {
    fn from(e: DigestError) -> Self {
        TrainError::Io {
            path: e.path,
            source: e.source,
        }
    }
}
