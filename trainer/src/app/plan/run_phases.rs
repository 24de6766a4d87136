//! Every phase of a run, not only its step: what a rank holds on its device and on the host
//! while it starts (random init or a weights load), steps, saves a checkpoint, resumes from
//! one and writes the final model, and what a process and a node hold at the run's peak.
//!
//! ```text
//! held        the rank's resident bytes (RankPlan::resident: weight shards or staging,
//!             gradient and moment shards) on the device; host-pool shards under the
//!             optimizer offload (RankPlan::host_optimizer) on the host
//! start-up    held, plus on the host one group's shard being read or drawn (4·max s) and a
//!             raw read piece of an HF or checkpoint file (st::READ_PIECE, or the shard
//!             when it is smaller)
//! step        the step's planned peak on the device (RankPlan::peak); held host bytes plus
//!             offloaded activations
//! save        held, plus on the host one tensor's copy and the writer's conversion of it
//!             (2 x 4·max s) and the file's write buffer
//! resume      as start-up (the rank's slices of weights and moments, one tensor at a time)
//! export      held, plus on the device the gathered padded group and its unpadded copy
//!             (4·max s·W + 4·max n; a host-pool shard's device copy 4·max s); rank 0 also
//!             holds the group on the host and a tensor's conversion (4·max n + 4·max slot)
//! evaluation  every rank runs the forward of its rows of each held-out batch on its shards
//!             (gathered groups as in a step's forward, nothing training, the full logits
//!             kept: Plan::eval, for held-out batches of a micro batch's rows); on the host a
//!             piece of the logits (eval::score::GREEDY_PIECE) and the argmax of every
//!             position
//! ```
//!
//! A process holds all its ranks: `cannon train --set parallel.nproc=N` runs N ranks in one
//! process (on the CPU their device memory is host memory too), `cannon launch` one per
//! process. A node holds `nproc_per_node` ranks.

use super::{Plan, RankPlan};
use crate::model::st::READ_PIECE;
use crate::model::ParamLayout;
use crate::parallel::fsdp::ShardLayout;
use crate::train::eval::score::GREEDY_PIECE;
use cannon_runtime::alloc::round_size;

/// The writer's buffer of a safetensors file being written (checkpoint shard or export).
const WRITE_BUFFER: usize = 1 << 20;

/// What one rank holds in one phase of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RunPhase {
    pub name: &'static str,
    /// Device bytes (the allocator's `allocated`).
    pub device: usize,
    /// Host bytes of this rank, and those only rank 0 (the writer) holds on top.
    pub host: usize,
    pub host_rank0: usize,
}

/// What a run holds at its peak, per rank, per process and per node.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RunPeaks {
    pub phases: Vec<RunPhase>,
    pub ranks_per_process: usize,
    pub ranks_per_node: usize,
    /// The largest device bytes of any phase, per rank.
    pub device_per_rank: usize,
    /// The largest host bytes of any phase of one process (rank 0's, whose process also
    /// writes and evaluates), device bytes excluded.
    pub host_per_process: usize,
    /// Host bytes a node holds at once: its processes' host peaks (rank 0's process once);
    /// on CPU ranks the device bytes are host memory too and are counted in.
    pub host_per_node: usize,
    /// On CPU ranks: the process's whole memory, device and host bytes (what its resident
    /// set grows to, less the binary, the data and the allocators' caches).
    pub process_total: usize,
}

/// The phases of the worst rank of `p`, over `ranks_per_node` ranks of a node (0: the
/// default, all of a CPU run's ranks in one process, 8 NPUs per node).
pub fn run_peaks(p: &Plan, ranks_per_node: usize, eval: bool) -> RunPeaks {
    let s = &p.settings;
    let layout = ParamLayout::new(&s.model);
    let sharded = s.nproc > 1 && s.fsdp;
    let world = if sharded { s.nproc } else { 1 };
    let cut = ShardLayout::new(&layout, world);
    let shard = round_size(4 * cut.largest_shard());
    let padded = cut
        .groups
        .iter()
        .map(|g| round_size(4 * g.padded(world)))
        .max()
        .unwrap_or(0);
    let group = layout
        .groups
        .iter()
        .map(|g| round_size(4 * g.len))
        .max()
        .unwrap_or(0);
    let slot = layout.slots().map(|(_, s)| 4 * s.len()).max().unwrap_or(0);
    let worst: &RankPlan = match p.ranks.iter().max_by_key(|r| r.peak()) {
        Some(r) => r,
        None => {
            return RunPeaks {
                phases: Vec::new(),
                ranks_per_process: 1,
                ranks_per_node: 1,
                device_per_rank: 0,
                host_per_process: 0,
                host_per_node: 0,
                process_total: 0,
            }
        }
    };
    let held = worst.resident();
    let pool = worst.host_optimizer;
    // A host-pool shard is copied to the device before its gather.
    let reload = if s.offload_optimizer { shard } else { 0 };
    // A read piece is at most the range it reads (a shard, 4 bytes an element at most).
    let read = pool + shard + READ_PIECE.min(shard);
    let mut phases = vec![
        RunPhase {
            name: "start-up (init or load)",
            device: held,
            host: read,
            host_rank0: 0,
        },
        RunPhase {
            name: "step",
            device: worst.peak(),
            host: pool + worst.host_activations,
            host_rank0: 0,
        },
        RunPhase {
            name: "checkpoint save",
            device: held,
            host: pool + 2 * shard + WRITE_BUFFER,
            host_rank0: 0,
        },
        RunPhase {
            name: "resume",
            device: held,
            host: read,
            host_rank0: 0,
        },
        RunPhase {
            name: "export (final model)",
            // The host-pool copy is dropped before the unpadded group is made.
            device: held + padded + group.max(reload),
            host: pool,
            host_rank0: group + slot + WRITE_BUFFER,
        },
    ];
    if eval {
        // Every rank runs the forward of its rows of each held-out batch on its shards with
        // the full logits kept (`Plan::eval`: batches of a micro batch's rows, of the step's
        // length, `train.eval_batch` = `train.micro_batch`), and reads their argmaxes in
        // pieces.
        let vocab = s.model.text_config.vocab_size.max(1);
        // A rank's share of a micro batch's rows (no CP: whole rows of max_len tokens).
        let positions = s.micro_batch.div_ceil(world) * s.max_len;
        let piece = positions.min((GREEDY_PIECE / (4 * vocab)).max(1)) * 4 * vocab;
        phases.push(RunPhase {
            name: "evaluation",
            device: held + p.eval.peak(),
            host: pool + piece + 4 * positions,
            host_rank0: 0,
        });
    }
    let cpu = s.device.is_cpu();
    let ranks_per_process = if cpu { s.nproc.max(1) } else { 1 };
    let ranks_per_node = match ranks_per_node {
        0 if cpu => s.nproc.max(1),
        0 => s.nproc.clamp(1, 8),
        n => n.min(s.nproc.max(1)),
    };
    let device_per_rank = phases.iter().map(|f| f.device).max().unwrap_or(0);
    let process_host = |f: &RunPhase| ranks_per_process * f.host + f.host_rank0;
    let host_per_process = phases.iter().map(process_host).max().unwrap_or(0);
    let process_total = phases
        .iter()
        .map(|f| process_host(f) + ranks_per_process * f.device)
        .max()
        .unwrap_or(0);
    let processes = ranks_per_node.div_ceil(ranks_per_process).max(1);
    let host_per_node = phases
        .iter()
        .map(|f| {
            let device = if cpu { ranks_per_node * f.device } else { 0 };
            processes * ranks_per_process.min(ranks_per_node) * f.host + f.host_rank0 + device
        })
        .max()
        .unwrap_or(0);
    RunPeaks {
        phases,
        ranks_per_process,
        ranks_per_node,
        device_per_rank,
        host_per_process,
        host_per_node,
        process_total,
    }
}
