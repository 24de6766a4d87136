//! What context parallelism can refuse or fail at. The model turns it into its own error
//! (`ModelError`), with a refused setting or layout as bad input.

use cannon_kernels::KernelError;
use cannon_runtime::comm::CommError;

#[derive(Debug, thiserror::Error)]
pub enum CpError {
    /// A layout or setting context parallelism cannot run (the message names the key).
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("collective failed: {0}")]
    Comm(#[from] CommError),
}

impl From<cannon_runtime::Error> for CpError {
    fn from(e: cannon_runtime::Error) -> Self {
        CpError::Kernel(KernelError::Runtime(e))
    }
}

pub type Result<T> = std::result::Result<T, CpError>;
