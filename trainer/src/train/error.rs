//! How a training run fails: [`TrainError`], with the helper that names the path of a
//! failed I/O call. Its own module so the run's plan, setup and loop all use it without
//! using each other.

use super::digest::DigestError;
use crate::model::ModelError;
use crate::train::config::ConfigError;
use crate::train::data::DataError;
use crate::train::eval::EvalError;
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
    Checkpoint(#[from] crate::train::checkpoint::CheckpointError),
    #[error("tensorboard: {0}")]
    TensorBoard(#[from] crate::train::tensorboard::TensorBoardError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Input(String),
    /// `log.dir` holds another run ([`super::run_dir`]).
    #[error(
        "{dir} already holds a run ({found}): to continue it, set checkpoint.resume = true \
         (--set checkpoint.resume=true); to start afresh there, pass --force, which moves the \
         old run aside to {dir}.old-<n> (nothing is deleted); or choose another log.dir",
        dir = dir.display()
    )]
    RunFolderTaken { dir: PathBuf, found: String },
    /// Stopped by a signal after a step, with every rank's checkpoint of it written
    /// ([`super::preempt`]).
    #[error(
        "stopped by {} after step {step}; checkpoint {}: run the same command with \
         checkpoint.resume = true to continue",
        super::preempt::signal_name(*signal),
        checkpoint.display()
    )]
    Preempted {
        step: usize,
        signal: i32,
        checkpoint: PathBuf,
    },
}

pub(super) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A refused context-parallel layout is the model's bad input, as it reads.
impl From<crate::parallel::cp::CpError> for TrainError {
    fn from(e: crate::parallel::cp::CpError) -> Self {
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
