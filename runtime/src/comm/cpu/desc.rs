//! What each rank says it is calling, and the cross-rank check that they all call the same thing.

use std::fmt;

use super::super::error::CommError;
use super::super::types::ReduceOp;
use crate::dtype::DType;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OpKind {
    AllReduce,
    AllGather,
    AllGatherV,
    ReduceScatter,
    ReduceScatterV,
    Broadcast,
    AllToAll,
    AllToAllV,
    Barrier,
    Split,
}

impl OpKind {
    pub(super) fn name(self) -> &'static str {
        match self {
            OpKind::AllReduce => "all_reduce",
            OpKind::AllGather => "all_gather",
            OpKind::AllGatherV => "all_gather_v",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::ReduceScatterV => "reduce_scatter_v",
            OpKind::Broadcast => "broadcast",
            OpKind::AllToAll => "all_to_all",
            OpKind::AllToAllV => "all_to_all_v",
            OpKind::Barrier => "barrier",
            OpKind::Split => "split",
        }
    }
}

/// One rank's view of a collective call. Every field except `split` (and the per-peer
/// `counts`/`recv_counts` of `all_to_all_v`) must be identical on all ranks.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct OpDesc {
    pub kind: OpKind,
    pub dtype: Option<DType>,
    pub reduce: Option<ReduceOp>,
    pub root: Option<usize>,
    /// all_reduce/broadcast: elements; all_gather: per-rank send; reduce_scatter: per-rank recv;
    /// all_to_all: per-peer chunk.
    pub count: usize,
    /// _v collectives: per-rank counts. all_to_all_v: this rank's send counts per destination.
    pub counts: Vec<usize>,
    /// all_to_all_v: this rank's receive counts per source.
    pub recv_counts: Vec<usize>,
    /// split: (color, key).
    pub split: Option<(u32, u32)>,
}

impl OpDesc {
    pub(super) fn new(kind: OpKind) -> Self {
        OpDesc {
            kind,
            dtype: None,
            reduce: None,
            root: None,
            count: 0,
            counts: Vec::new(),
            recv_counts: Vec::new(),
            split: None,
        }
    }
}

impl fmt::Display for OpDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(", self.kind.name())?;
        if let Some(d) = self.dtype {
            write!(f, "{d}, ")?;
        }
        if let Some(r) = self.reduce {
            write!(f, "{r:?}, ")?;
        }
        if let Some(r) = self.root {
            write!(f, "root {r}, ")?;
        }
        match self.kind {
            OpKind::AllGatherV | OpKind::ReduceScatterV => write!(f, "counts {:?}", self.counts)?,
            OpKind::AllToAllV => write!(f, "send {:?}, recv {:?}", self.counts, self.recv_counts)?,
            OpKind::Barrier => {}
            OpKind::Split => {
                if let Some((c, k)) = self.split {
                    write!(f, "color {c}, key {k}")?
                }
            }
            _ => write!(f, "count {}", self.count)?,
        }
        write!(f, ")")
    }
}

/// Checks that all ranks' descriptions describe one collective. `descs[i]` is rank i's.
pub(super) fn check_match(descs: &[&OpDesc]) -> Result<(), CommError> {
    let Some(first) = descs.first() else {
        return Ok(());
    };
    for (rank, d) in descs.iter().enumerate().skip(1) {
        let same = d.kind == first.kind
            && d.dtype == first.dtype
            && d.reduce == first.reduce
            && d.root == first.root
            && match first.kind {
                // Per-peer counts are cross-checked below; colors and keys differ by design.
                OpKind::AllToAllV | OpKind::Split => true,
                _ => d.count == first.count && d.counts == first.counts,
            };
        if !same {
            return Err(CommError::Mismatch {
                op: first.kind.name(),
                detail: format!("rank 0 called {first} but rank {rank} called {d}"),
            });
        }
    }
    if first.kind == OpKind::AllToAllV {
        // What i sends to j is what j expects from i.
        for (i, di) in descs.iter().enumerate() {
            for (j, dj) in descs.iter().enumerate() {
                let sent = di.counts.get(j).copied();
                let expected = dj.recv_counts.get(i).copied();
                if sent != expected {
                    return Err(CommError::Mismatch {
                        op: first.kind.name(),
                        detail: format!(
                            "rank {i} sends {sent:?} elements to rank {j}, which expects \
                             {expected:?} from it"
                        ),
                    });
                }
            }
        }
    }
    Ok(())
}
