//! The runtime's error type: every variant names the failing call, the device or the rank.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error(transparent)]
    Sys(#[from] cannon_sys::Error),
}

pub type Result<T> = std::result::Result<T, Error>;
