//! FSDP (ZeRO-3) data parallelism over the runtime's [`Communicator`](cannon_runtime::comm::Communicator): every layer group's
//! flat parameter buffer is sharded over the ranks (`shard`: padded, never dropped), a
//! group is all-gathered just before the model uses it with the next group's gather issued
//! first, freed after use, and gathered again in the backward; its full gradient is
//! reduce-scattered into the rank's gradient shard and freed (`reduce`); `schedule` keeps
//! every rank's collectives in the same order. AdamW, the f32
//! master weights and the moments exist only for the local shard; the gradient norm is taken
//! from the shards and all-reduced (`rank`).
//!
//! Data parallel: a step's global batch is every rank's micro batches; each rank's loss is
//! divided by the global count of trained targets (all-reduced), so the summed gradient is the
//! gradient of the global mean and N ranks step like one rank over the same micro batches.
//!
//! ```no_run
//! use cannon_trainer::parallel::fsdp::{rank_share, run_cpu_ranks, FsdpRank, FsdpSettings, ShardSource};
//! # fn demo(cfg: cannon_trainer::model::Mistral3Config, host: Vec<Vec<f32>>,
//! #         settings: FsdpSettings, micro: Vec<cannon_trainer::model::batch::Batch>)
//! #         -> Result<(), cannon_trainer::parallel::fsdp::FsdpError> {
//! let world = 2;
//! let losses = run_cpu_ranks(world, std::time::Duration::from_secs(60), |comm, exec| {
//!     let r = comm.rank();
//!     let source = ShardSource::Full(&host);
//!     let mut rank = FsdpRank::new(comm, exec, cfg.clone(), source, settings.clone())?;
//!     // this rank's rows of every micro batch of the step
//!     let mine = rank_share(&cfg, &micro, r, world)?;
//!     let stats = rank.step::<f32>(&mine, 1e-3)?;
//!     Ok(stats.loss)
//! })?;
//! # Ok(()) }
//! ```

pub(crate) mod rank;
pub(crate) mod reduce;
pub(crate) mod saved;
pub(crate) mod schedule;
pub(crate) mod settings;
pub(crate) mod shard;
pub(crate) mod source;
pub(crate) mod split;
pub(crate) mod state;
pub(crate) mod world;

pub use rank::{FsdpRank, FsdpSettings, StepStats};
pub use saved::{Kind, SavedRun, SavedShards};
pub use settings::TrainSettings;
pub use shard::{GroupShard, ShardLayout};
pub use source::ShardSource;
pub use split::{rank_rows, rank_share, split_rows};
pub use state::{GroupState, ShardState};
pub use world::{cpu_rank_exec, meta_rank_exec, run_cpu_ranks, run_meta_ranks};

use crate::model::ModelError;
use cannon_kernels::KernelError;
use cannon_runtime::comm::CommError;

/// What can go wrong in a sharded run.
#[derive(Debug, thiserror::Error)]
pub enum FsdpError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("collective failed: {0}")]
    Comm(#[from] CommError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("fsdp: {0}")]
    Invalid(String),
    #[error("rank {rank}: micro batch {index} rejected: {source}")]
    Batch {
        rank: usize,
        index: usize,
        source: ModelError,
    },
    #[error("rank {rank}: {ranks} rank(s) rejected a micro batch of this step")]
    PeerBatch { rank: usize, ranks: usize },
    #[error("rank {rank} panicked: {message}")]
    RankPanicked { rank: usize, message: String },
    #[error("rank {rank}: {source}")]
    OnRank { rank: usize, source: Box<FsdpError> },
}

impl From<cannon_runtime::Error> for FsdpError {
    fn from(e: cannon_runtime::Error) -> Self {
        FsdpError::Kernel(KernelError::Runtime(e))
    }
}

/// A refused context-parallel layout is the model's bad input, as it reads.
impl From<crate::parallel::cp::CpError> for FsdpError {
    fn from(e: crate::parallel::cp::CpError) -> Self {
        crate::model::ModelError::from(e).into()
    }
}

impl FsdpError {
    /// Whether this error only reports that another rank failed (a peer dropped its
    /// communicator, a poisoned group, a peer's rejected batch), not a cause of its own.
    pub fn is_peer_failure(&self) -> bool {
        let comm = |e: &CommError| {
            matches!(
                e,
                CommError::PeerDropped { .. } | CommError::Poisoned { .. }
            )
        };
        match self {
            FsdpError::Comm(e) | FsdpError::Model(ModelError::Comm(e)) => comm(e),
            FsdpError::PeerBatch { .. } => true,
            FsdpError::OnRank { source, .. } => source.is_peer_failure(),
            _ => false,
        }
    }

    /// Names the rank (errors that already carry one are left as they are).
    pub fn on_rank(self, rank: usize) -> Self {
        match self {
            e @ (FsdpError::Batch { .. }
            | FsdpError::PeerBatch { .. }
            | FsdpError::RankPanicked { .. }
            | FsdpError::OnRank { .. }) => e,
            e => FsdpError::OnRank {
                rank,
                source: Box::new(e),
            },
        }
    }
}
