//! cannon-sys: raw FFI to AscendCL, aclnn and HCCL, dlopened at run time.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("library {library} not found; searched: {}", searched.join(", "))]
    LibraryNotFound {
        library: String,
        searched: Vec<String>,
    },
}
