//! One rank's handle on an in-process group, and what every call shares: entering a round
//! (numbered by the rank's call count), the round's descriptor, the argument checks that
//! fail the group, and the building of a split's groups.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::super::error::{CommError, CommResult};
use super::super::types::ReduceOp;
use super::bufs::RawBufs;
use super::desc::{OpDesc, OpKind};
use super::exec;
use super::group::{self, Group, Post};
use crate::device::Device;
use crate::dtype::Element;

/// One rank's handle on a group of in-process ranks.
///
/// `Send` (move it into the rank's thread) but not `Sync` or `Clone`: a rank issues its calls in
/// order from one place, as with HCCL. Dropping it tells the peers that this rank is gone, so
/// their pending and future collectives fail at once instead of waiting for the timeout.
pub(crate) struct CpuCommunicator {
    /// The CPU, or the meta device (rounds without data).
    pub(super) device: Device,
    pub(super) group: Arc<Group>,
    pub(super) rank: usize,
    timeout: Cell<Duration>,
    /// Collectives this rank has called on this group (failed ones included): the round it
    /// takes part in next.
    seq: Cell<u64>,
}

impl Drop for CpuCommunicator {
    fn drop(&mut self) {
        self.group.mark_dropped(self.rank);
    }
}

impl std::fmt::Debug for CpuCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuCommunicator")
            .field("rank", &self.rank)
            .field("world_size", &self.group.size())
            .field("timeout", &self.timeout.get())
            .finish()
    }
}

impl CpuCommunicator {
    pub(super) fn new(device: Device, group: Arc<Group>, rank: usize, timeout: Duration) -> Self {
        CpuCommunicator {
            device,
            group,
            rank,
            timeout: Cell::new(timeout),
            seq: Cell::new(0),
        }
    }

    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    pub(crate) fn device(&self) -> Device {
        self.device
    }

    pub(crate) fn world_size(&self) -> usize {
        self.group.size()
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout.get()
    }

    pub(crate) fn set_timeout(&self, timeout: Duration) {
        self.timeout.set(timeout);
    }
}

impl CpuCommunicator {
    pub(super) fn run<T: Element>(&self, desc: OpDesc, bufs: RawBufs) -> CommResult<()> {
        let round = self.enter(desc, bufs)?;
        match self.device.is_meta() {
            // Checked locally and against the peers' calls (enter); nothing to move.
            true => self.group.stage(true),
            false => exec::execute::<T>(&self.group, &round, self.rank),
        }
        Ok(())
    }

    pub(super) fn enter(&self, desc: OpDesc, bufs: RawBufs) -> CommResult<Arc<group::Round>> {
        let seq = self.next_seq();
        let post = Post { desc, bufs };
        self.group
            .enter(self.rank, seq, post, self.timeout(), build_split)
    }

    pub(super) fn data_desc<T: Element>(&self, kind: OpKind, count: usize) -> OpDesc {
        let mut d = OpDesc::new(kind);
        d.dtype = Some(T::DTYPE);
        d.count = count;
        d
    }

    pub(super) fn reduce_desc<T: Element>(
        &self,
        kind: OpKind,
        op: ReduceOp,
        count: usize,
    ) -> CommResult<OpDesc> {
        op.check(kind.name(), T::DTYPE)
            .map_err(|e| self.reject(true, e))?;
        let mut d = self.data_desc::<T>(kind, count);
        d.reduce = Some(op);
        Ok(d)
    }

    pub(super) fn check_len(
        &self,
        kind: OpKind,
        what: &str,
        got: usize,
        want: usize,
    ) -> CommResult<()> {
        if got == want {
            return Ok(());
        }
        let e = CommError::InvalidArgument {
            op: kind.name(),
            detail: format!(
                "rank {}: {what} has {got} elements, expected {want}",
                self.rank
            ),
        };
        Err(self.reject(true, e))
    }

    pub(super) fn check_counts(&self, kind: OpKind, counts: &[usize]) -> CommResult<()> {
        self.check_len(kind, "the counts array", counts.len(), self.world_size())
    }

    pub(super) fn check_rank(
        &self,
        op: &'static str,
        collective: bool,
        rank: usize,
    ) -> CommResult<()> {
        if rank < self.world_size() {
            return Ok(());
        }
        let e = CommError::InvalidRank {
            op,
            rank,
            world_size: self.world_size(),
        };
        Err(self.reject(collective, e))
    }

    /// Fails the group for an error found on this rank alone. A collective's failure still
    /// counts as this rank's call, so its next collective is judged as the next round.
    pub(super) fn reject(&self, collective: bool, e: CommError) -> CommError {
        let seq = collective.then(|| self.next_seq());
        self.group.fail_local(seq, e)
    }

    fn next_seq(&self) -> u64 {
        let s = self.seq.get();
        self.seq.set(s + 1);
        s
    }
}

/// Builds the groups of a split (run once, by the rank that completes the posting).
fn build_split(posts: &[Post]) -> Vec<(Arc<Group>, usize)> {
    let mut by_color: BTreeMap<u32, Vec<(u32, usize)>> = BTreeMap::new();
    for (old, p) in posts.iter().enumerate() {
        let (color, key) = p.desc.split.unwrap_or((0, 0));
        by_color.entry(color).or_default().push((key, old));
    }
    let mut out: Vec<Option<(Arc<Group>, usize)>> = (0..posts.len()).map(|_| None).collect();
    for mut members in by_color.into_values() {
        members.sort_unstable();
        let group = Group::new(members.len());
        for (new, &(_, old)) in members.iter().enumerate() {
            out[old] = Some((group.clone(), new));
        }
    }
    out.into_iter().flatten().collect()
}
