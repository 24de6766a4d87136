//! cannon-runtime: devices, streams, events, buffers, allocator statistics, communicators.

pub mod comm;
pub mod error;

pub use error::{Error, Result};
