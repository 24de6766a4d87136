//! What the model can refuse or fail at: [`ModelError`] and, reading weights,
//! [`WeightsError`]. A leaf of the model: the readers below it (checkpoint I/O, context
//! parallelism) wrap or convert into these without importing the model itself.

use super::config::ConfigError;
use crate::model::batch::BatchError;
use cannon_kernels::KernelError;
use cannon_runtime::comm::CommError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error(
        "image features and image tokens do not match: {tokens} [IMG] tokens, {features} \
         image feature rows"
    )]
    ImageTokens { tokens: usize, features: usize },
    #[error("bad input: {0}")]
    Input(String),
    #[error("bad batch: {0}")]
    Batch(#[from] BatchError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// A collective of a sharded pass (gathering a group, reduce-scattering its gradient).
    #[error("collective failed: {0}")]
    Comm(#[from] CommError),
    /// A pass asked a sharded source or sink for a group out of its [`super::GroupOrder`].
    #[error("the pass left its plan: {0}")]
    Plan(String),
}

impl From<crate::parallel::cp::CpError> for ModelError {
    fn from(e: crate::parallel::cp::CpError) -> Self {
        use crate::parallel::cp::CpError;
        match e {
            CpError::Input(m) => ModelError::Input(m),
            CpError::Kernel(e) => ModelError::Kernel(e),
            CpError::Comm(e) => ModelError::Comm(e),
        }
    }
}

impl From<cannon_runtime::Error> for ModelError {
    fn from(e: cannon_runtime::Error) -> Self {
        ModelError::Kernel(KernelError::Runtime(e))
    }
}

impl ModelError {
    /// A group index past the model's `groups`.
    pub(crate) fn no_group(g: usize, groups: usize) -> Self {
        ModelError::Input(format!(
            "parameter group {g} does not exist (the model has {groups})"
        ))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a safetensors file: {reason}")]
    Format { path: PathBuf, reason: String },
    #[error("{path}: bad index: {reason}")]
    Index { path: PathBuf, reason: String },
    #[error("no weights in {0}: expected model.safetensors or model.safetensors.index.json")]
    NoWeights(PathBuf),
    #[error("checkpoint lacks tensor {name} (and {more} more)")]
    Missing { name: String, more: usize },
    #[error("{path}: tensor {name} is not a parameter of this model config")]
    Unexpected { path: PathBuf, name: String },
    #[error("{path}: tensor {name} appears twice (also as {other})")]
    Duplicate {
        path: PathBuf,
        name: String,
        other: String,
    },
    #[error("{path}: tensor {name} has shape {found:?}, the config needs {expected:?}")]
    Shape {
        path: PathBuf,
        name: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("a weights range out of bounds: {0}")]
    Range(String),
    #[error("{path}: tensor {name} has dtype {dtype}; f32, bf16 and f16 are supported")]
    Dtype {
        path: PathBuf,
        name: String,
        dtype: String,
    },
}
