//! `CommError`: every failure of a collective names the op, the rank that reports it and, where
//! the failure is about peers, the peer rank(s) involved.

use std::time::Duration;

use thiserror::Error;

use super::types::ReduceOp;
use crate::device::Device;
use crate::dtype::DType;

/// The error of every communicator call (CPU and HCCL).
///
/// `Clone` so that one failure detected by one rank can be handed to every rank of the group
/// that was waiting in the same collective.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum CommError {
    /// Some ranks never arrived at the collective within the timeout.
    #[error(
        "{op}: rank {rank} waited {waited:?} (timeout {timeout:?}) but rank(s) {missing:?} of a \
         group of {world_size} never arrived"
    )]
    Timeout {
        op: &'static str,
        rank: usize,
        missing: Vec<usize>,
        world_size: usize,
        waited: Duration,
        timeout: Duration,
    },

    /// Some ranks dropped their communicator, so the collective can never complete.
    #[error("{op}: rank {rank} cannot complete: rank(s) {dropped:?} dropped their communicator")]
    PeerDropped {
        op: &'static str,
        rank: usize,
        dropped: Vec<usize>,
    },

    /// Ranks called different collectives, or the same one with incompatible arguments.
    #[error("{op}: ranks disagree: {detail}")]
    Mismatch { op: &'static str, detail: String },

    /// An earlier failure left the group unusable (like an aborted NCCL communicator).
    #[error("{op}: communicator unusable after an earlier failure: {cause}")]
    Poisoned { op: &'static str, cause: String },

    /// A buffer length or count that is wrong on this rank alone.
    #[error("{op}: {detail}")]
    InvalidArgument { op: &'static str, detail: String },

    /// A buffer or the stream of a call is not on the communicator's device.
    #[error("{op}: rank {rank}: {what} is on {found}, the communicator is on {expected}")]
    DeviceMismatch {
        op: &'static str,
        rank: usize,
        what: &'static str,
        expected: Device,
        found: Device,
    },

    /// `reduce_scatter`/`all_to_all` need the buffer to split evenly over the ranks.
    #[error(
        "{op}: {len} elements do not split evenly over {world_size} ranks (use the _v variant \
         with per-rank counts)"
    )]
    NotDivisible {
        op: &'static str,
        len: usize,
        world_size: usize,
    },

    /// A rank argument (root, peer, split member) outside the group.
    #[error("{op}: rank {rank} is out of range for a group of {world_size}")]
    InvalidRank {
        op: &'static str,
        rank: usize,
        world_size: usize,
    },

    /// A reduce op that the dtype (or backend) does not support, e.g. `Avg` on integers.
    #[error("{op}: reduce op {reduce_op:?} is not supported for {dtype}: {detail}")]
    UnsupportedReduce {
        op: &'static str,
        reduce_op: ReduceOp,
        dtype: DType,
        detail: &'static str,
    },

    /// A malformed or missing distributed environment (RANK, WORLD_SIZE, ...).
    #[error("environment variable {var}: {detail}")]
    Env { var: &'static str, detail: String },

    /// The file-based rendezvous that ships HCCL's root info failed.
    #[error("rendezvous at {path}: {detail}")]
    Rendezvous { path: String, detail: String },

    /// The TCP store at MASTER_ADDR:MASTER_PORT did not answer, or a key did not appear,
    /// within the timeout.
    #[error("TCP store at {addr}: {what}: nothing within {timeout:?}")]
    StoreTimeout {
        addr: String,
        what: String,
        timeout: Duration,
    },

    /// The TCP store serves a job of another size (a stale job on the port, or WORLD_SIZE
    /// differs between ranks).
    #[error(
        "TCP store at {addr}: this rank has WORLD_SIZE {ours}, the store's job has {theirs} \
         (ranks disagree on WORLD_SIZE, or another job uses MASTER_PORT)"
    )]
    WorldSizeMismatch {
        addr: String,
        ours: usize,
        theirs: usize,
    },

    /// The TCP store did not admit this rank (job token missing or wrong), or its server
    /// could not prove it holds the job's token.
    #[error("TCP store at {addr}: not admitted: {detail}")]
    StoreAuth { addr: String, detail: String },

    /// The TCP store failed otherwise (cannot listen, connection lost, refused request).
    #[error("TCP store at {addr}: {detail}")]
    Store { addr: String, detail: String },

    /// An HCCL call returned an error code.
    #[error("{call} failed with HcclResult {code} ({message})")]
    Hccl {
        call: &'static str,
        code: i32,
        message: String,
    },

    /// A runtime call under a collective failed (device binding, stream, temporary buffers).
    #[error("{call}: {message}")]
    Runtime { call: &'static str, message: String },

    /// The CANN libraries could not be loaded (kept as text so that `CommError` stays `Clone`).
    #[error("CANN library: {0}")]
    Sys(String),
}

impl From<cannon_sys::Error> for CommError {
    fn from(e: cannon_sys::Error) -> Self {
        CommError::Sys(e.to_string())
    }
}

pub type CommResult<T> = std::result::Result<T, CommError>;

// Here rather than beside `ReduceOp` (types.rs): the error names the op, so the op's file stays
// below this one.
impl ReduceOp {
    /// Rejects combinations that have no meaning, before any rank touches a buffer.
    pub fn check(self, op: &'static str, dtype: DType) -> Result<(), CommError> {
        if self == ReduceOp::Avg && !dtype.is_float() {
            return Err(CommError::UnsupportedReduce {
                op,
                reduce_op: self,
                dtype,
                detail: "an integer average would truncate; reduce with Sum and divide",
            });
        }
        Ok(())
    }
}
