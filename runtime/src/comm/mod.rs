//! Collective communication, dtype-generic and counted in elements.
//!
//! - [`Communicator`] (always built): ranks are threads of one process; collectives read peers'
//!   host buffers directly under a round-based rendezvous. Made by [`CpuWorld::new`]; groups
//!   split with [`Communicator::split`] (data-parallel x context-parallel).
//! - `HcclCommunicator` (feature `npu`): the same calls over device pointers on HCCL, one process
//!   per NPU, bootstrapped through [`rendezvous`] (RANK/WORLD_SIZE/LOCAL_RANK like torchrun).
//!
//! Every wait for peers is bounded by a timeout; a failure (timeout, a dropped peer, ranks that
//! disagree on the call) is a [`CommError`] on every rank involved and poisons the group.

mod cpu;
mod error;
#[cfg(feature = "npu")]
mod hccl;
pub mod rendezvous;
mod types;

pub use cpu::{even_counts, Communicator, CpuWorld};
pub use error::{CommError, CommResult};
#[cfg(feature = "npu")]
pub use hccl::HcclCommunicator;
pub use types::ReduceOp;
